package fleet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// bridgeReadyTimeout bounds the wait for a bridge process to be ready:
// every bridge in it connected, its first relist merged. A restart after
// a kill also reads back what its nodes stored after their checkpoints.
const bridgeReadyTimeout = 3 * time.Minute

// bridgeGroup is one bridge process and the nodes whose bridges it runs.
type bridgeGroup struct {
	proc  *proc.Process
	nodes []int // indices into the fleet's nodes
}

// newBridgeGroups spreads the nodes' bridges over procs processes, in
// contiguous runs, each bridge with its own data directory under dir.
func newBridgeGroups(o Options, ns *nodes, urls []string, dir string) ([]*bridgeGroup, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the bridges' directory: %w", err)
	}
	var groups []*bridgeGroup
	per := (len(ns.list) + o.Procs - 1) / o.Procs
	for g := 0; g*per < len(ns.list); g++ {
		spec := &bridgesSpec{
			URLs: strings.Join(urls, ","), Stream: streamName, Replicas: replicas, MaxAge: streamMaxAge,
			DuplicateWindow: duplicateWindow, StateBucket: stateBucket, LogLevel: o.BridgeLogLevel, NoRepair: o.NoRepair,
		}
		group := &bridgeGroup{}
		for i := g * per; i < min((g+1)*per, len(ns.list)); i++ {
			n := ns.list[i]
			spec.Nodes = append(spec.Nodes, nodeSpec{Name: n.name, Socket: n.socket, DataDir: filepath.Join(dir, n.name)})
			group.nodes = append(group.nodes, i)
		}
		name := fmt.Sprintf("bridges-%d", g)
		p, err := newProcess(name, o.ChildCommand, childSpec{Role: roleBridges, Bridges: spec}, filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		group.proc = p
		groups = append(groups, group)
	}
	return groups, nil
}

// startGroups starts the groups' processes at once and waits until each
// is ready.
func startGroups(ctx context.Context, groups []*bridgeGroup) error {
	var eg errgroup.Group
	for _, g := range groups {
		eg.Go(func() error { return g.proc.StartReady(ctx, bridgeReadyTimeout) })
	}
	return eg.Wait()
}

// dropped asks each group's process for its bridges' dropped events and
// returns the sum; a process that does not answer counts 0, and a warning
// is logged by the caller.
func dropped(ctx context.Context, groups []*bridgeGroup) (float64, error) {
	var sum float64
	var firstErr error
	for _, g := range groups {
		var st childStats
		if err := g.proc.Request(ctx, requestDropped, &st); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		sum += st.Dropped
	}
	return sum, firstErr
}
