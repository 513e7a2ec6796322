package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

// leaderElectedSubject is where the servers announce a new leader of the
// stream (JetStream's leader-elected advisory), with their own timestamp.
const leaderElectedSubject = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED." + streamName

// leaderElected is the part of the advisory the harness reads.
type leaderElected struct {
	Time   time.Time `json:"timestamp"`
	Leader string    `json:"leader"`
}

// killLeader kills (SIGKILL) the server that leads the stream while every
// node churns, waits for the other servers' advisory that one of them
// leads it now, and starts the killed server again after FaultLength. The
// election time is the advisory's timestamp less the kill's, both from
// this machine's clock. The advisory is read on a connection of its own
// to a server that is not killed: the harness's own connection may be to
// the leader, and would miss it while it reconnects.
func (f *fleet) killLeader(ctx context.Context) (FaultRecord, error) {
	ictx, cancel := context.WithTimeout(ctx, streamCurrentTimeout)
	s, err := f.js.Stream(ictx, streamName)
	cancel()
	if err != nil {
		return FaultRecord{}, fmt.Errorf("find the stream's leader: %w", err)
	}
	var leader string
	if cl := s.CachedInfo().Cluster; cl != nil {
		leader = cl.Leader
	}
	victim := slices.IndexFunc(f.servers.procs, func(p *proc.Process) bool { return p.Name() == leader })
	if victim < 0 {
		return FaultRecord{}, fmt.Errorf("find the stream's leader: %q is none of the servers", leader)
	}
	nc, err := nats.Connect(f.servers.urls[(victim+1)%len(f.servers.urls)])
	if err != nil {
		return FaultRecord{}, fmt.Errorf("connect for the leader-elected advisory: %w", err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync(leaderElectedSubject)
	if err != nil {
		return FaultRecord{}, fmt.Errorf("subscribe to the leader-elected advisory: %w", err)
	}
	if err := nc.Flush(); err != nil {
		return FaultRecord{}, fmt.Errorf("subscribe to the leader-elected advisory: %w", err)
	}

	killed := time.Now()
	f.servers.procs[victim].Kill()
	actx, cancel := context.WithTimeout(ctx, streamCurrentTimeout)
	defer cancel()
	var adv leaderElected
	for adv.Leader == "" || adv.Leader == leader {
		msg, err := sub.NextMsgWithContext(actx)
		if err != nil {
			return FaultRecord{}, fmt.Errorf("wait for a new leader of stream %s after %s was killed: %w", streamName, leader, err)
		}
		if err := json.Unmarshal(msg.Data, &adv); err != nil {
			return FaultRecord{}, fmt.Errorf("read the leader-elected advisory: %w", err)
		}
	}
	election := adv.Time.Sub(killed)
	if err := f.runner.Wait(ctx, f.opts.FaultLength); err != nil {
		return FaultRecord{}, err
	}
	repaired, current, err := f.startServers(ctx, func(ctx context.Context) error {
		return f.servers.procs[victim].StartReady(ctx, serverReadyTimeout)
	})
	if err != nil {
		return FaultRecord{}, err
	}
	return FaultRecord{
		Note: fmt.Sprintf("stream leader %s killed (SIGKILL), %s elected %v after by the servers' advisory; started again %v after that, stream current %v after",
			leader, adv.Leader, roundDelay(election), f.opts.FaultLength, roundDelay(current)),
		Repaired: repaired,
		Election: election,
	}, nil
}

// Stalls sums up how long the nodes' transitions waited in a fault's
// window: for each node that made one, the longest time from its
// runtime's transition to the stream's storage of it; P50 and Max over
// those nodes.
type Stalls struct {
	Nodes    int
	P50, Max time.Duration
}

// measureStalls fills in the stalls of each leader-kill fault, from the
// transitions made in its window and the stream's storage times.
func (f *fleet) measureStalls(stored []soak.Stored) {
	first := firstStored(stored)
	for i, rec := range f.faults {
		if rec.Name != FaultLeaderKill {
			continue
		}
		w := f.windows[slices.IndexFunc(f.windows, func(w soak.Window) bool { return w.Name == rec.Name })]
		var worst []time.Duration
		for _, n := range f.nodes.list {
			longest, seen := time.Duration(0), false
			for _, t := range n.churn.Transitions() {
				s, ok := first[storedKey{t.ContainerID, t.Type}]
				if ok && !t.At.Before(w.From) && t.At.Before(w.To) {
					longest, seen = max(longest, s.StoredAt.Sub(t.At)), true
				}
			}
			if seen {
				worst = append(worst, longest)
			}
		}
		slices.Sort(worst)
		if len(worst) > 0 {
			f.faults[i].Stalls = Stalls{Nodes: len(worst), P50: percentile(worst, 0.5), Max: worst[len(worst)-1]}
		}
	}
}
