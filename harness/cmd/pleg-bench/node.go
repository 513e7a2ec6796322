package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// childReadyTimeout bounds the wait for a child to reach its steady state:
// the bridge's first relist of 30,000 containers, all acked, included.
const childReadyTimeout = 2 * time.Minute

// nodeSize is a simulated node's population.
type nodeSize struct{ pods, containers int }

func (s nodeSize) String() string { return fmt.Sprintf("%d/%d", s.pods, s.containers) }

// parseSizes reads "110/330,1000/5000".
func parseSizes(s string) ([]nodeSize, error) {
	var out []nodeSize
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, c, ok := strings.Cut(f, "/")
		pods, err1 := strconv.Atoi(p)
		ctrs, err2 := strconv.Atoi(c)
		if !ok || err1 != nil || err2 != nil || pods <= 0 || ctrs < 0 {
			return nil, fmt.Errorf("node size %q: want pods/containers, e.g. 1000/5000", f)
		}
		out = append(out, nodeSize{pods, ctrs})
	}
	return out, nil
}

// child is a running child process (see maybeRunChild).
type child struct {
	proc *proc.Process
	node string // a bridge's node name
	// cgroup is the memory cgroup the child runs in, nil for none.
	cgroup *memCgroup
}

// startChild starts this executable as the child spec describes, with extra
// environment variables, and waits until it is ready.
func startChild(ctx context.Context, name string, spec childSpec, extraEnv ...string) (*child, error) {
	return startChildIn(ctx, nil, name, spec, extraEnv...)
}

// startChildIn is startChild with the child in the memory cgroup cg (nil:
// none) from its start.
func startChildIn(ctx context.Context, cg *memCgroup, name string, spec childSpec, extraEnv ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	command := []string{exe}
	if cg != nil {
		path, args := cg.wrap(exe)
		command = append([]string{path}, args...)
	}
	p := proc.New(name, command, proc.Options{
		Env:    append(append(os.Environ(), childEnv+"="+string(b)), extraEnv...),
		Stderr: os.Stderr,
		Lines:  true,
	})
	if err := p.StartReady(ctx, childReadyTimeout); err != nil {
		return nil, err
	}
	return &child{proc: p, cgroup: cg}, nil
}

// stats asks the child for its figures.
func (c *child) stats(ctx context.Context) (childStats, error) {
	var st childStats
	if err := c.proc.Request(ctx, "stats", &st); err != nil {
		return childStats{}, fmt.Errorf("ask %s for its stats: %w", c.proc.Name(), err)
	}
	return st, nil
}

// stop closes the child's stdin, which stops it, and waits for it (killing
// it after a grace period).
func (c *child) stop() error {
	return c.proc.Stop(proc.CloseStdin)
}

// nodeRun is one simulated node in a runtime process of its own, with the
// processes measured against it.
type nodeRun struct {
	dir     string
	runtime *child
	socket  string
	natsURL string
	nodes   int // bridges started, for their node names
	// memoryOnly runs the bridges without a data directory: no checkpoint,
	// no spool, nothing written through.
	memoryOnly bool
	// bridgeEnv is added to the bridges' environment.
	bridgeEnv []string
}

func startNode(ctx context.Context, dir, natsURL string, size nodeSize, memoryOnly bool) (*nodeRun, error) {
	sock := filepath.Join(dir, "cri.sock")
	rt, err := startChild(ctx, "runtime "+size.String(), childSpec{Role: roleRuntime, Socket: sock, Pods: size.pods, Containers: size.containers})
	if err != nil {
		return nil, err
	}
	return &nodeRun{dir: dir, runtime: rt, socket: sock, natsURL: natsURL, memoryOnly: memoryOnly}, nil
}

// bridge starts a bridge in mode on the node, with a data directory of its
// own, as the DaemonSet runs it.
func (n *nodeRun) bridge(ctx context.Context, mode generator.Mode, extraEnv ...string) (*child, error) {
	return n.bridgeIn(ctx, nil, mode, extraEnv...)
}

// bridgeIn is bridge in the memory cgroup cg (nil: none).
func (n *nodeRun) bridgeIn(ctx context.Context, cg *memCgroup, mode generator.Mode, extraEnv ...string) (*child, error) {
	n.nodes++
	// The directory is unique: a node name is never used twice in a run,
	// so the stream holds each bridge's messages apart.
	node := fmt.Sprintf("bench-%s-%s-%d", mode, strings.TrimPrefix(filepath.Base(n.dir), "pleg-bench-"), n.nodes)
	data := filepath.Join(n.dir, node)
	if n.memoryOnly {
		data = ""
	}
	c, err := startChildIn(ctx, cg, string(mode)+" bridge", childSpec{
		Role: roleBridge, Socket: n.socket, Mode: mode, NATSURL: n.natsURL, DataDir: data, Node: node,
	}, append(extraEnv, n.bridgeEnv...)...)
	if err != nil {
		return nil, err
	}
	c.node = node
	return c, nil
}

func (n *nodeRun) bare(ctx context.Context) (*child, error) {
	return startChild(ctx, "bare loop", childSpec{Role: roleBare, Socket: n.socket, Period: generator.DefaultRelistPeriod})
}

func (n *nodeRun) close() error {
	return n.runtime.stop()
}

// stopAll stops the children and joins their errors.
func stopAll(cs ...*child) error {
	var errs []error
	for _, c := range cs {
		if c != nil {
			if err := c.stop(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
