package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
	"github.com/pleg-bridge/pleg-bridge/harness/soak"
)

// Machine faults: the servers lose what they acknowledged, as after a
// power loss or an OS crash (nats-server flushes its files every
// sync_interval, 2 minutes by default; a killed process loses nothing,
// the page cache outlives it). The servers are processes of their own, so
// a consistent copy of a store is taken while its server is paused
// (SIGSTOP: it writes nothing), and put back after the server is killed
// (SIGKILL): what it acknowledged since is gone. docs/soak.md says what
// this models and what it does not.

// snapshot pauses the servers is at once, copies their stores, and resumes
// them. It returns the copies, by server.
func (f *fleet) snapshot(is []int) (map[int]string, error) {
	for _, i := range is {
		if err := f.servers.procs[i].Pause(); err != nil {
			return nil, err
		}
	}
	snaps := map[int]string{}
	var err error
	for _, i := range is {
		var snap string
		if snap, err = soak.CopyStore(f.servers.dirs[i], f.opts.Dir); err != nil {
			break
		}
		snaps[i] = snap
	}
	for _, i := range is {
		if serr := f.servers.procs[i].Resume(); serr != nil && err == nil {
			err = serr
		}
	}
	return snaps, err
}

// streamState returns the stream's last sequence and message count, zeros
// if it cannot be read.
func (f *fleet) streamState(ctx context.Context) (last, msgs uint64) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := f.js.Stream(ictx, streamName)
	if err != nil {
		return 0, 0
	}
	st := s.CachedInfo().State
	return st.LastSeq, st.Msgs
}

// streamLeader returns the index of the server that leads the stream.
func (f *fleet) streamLeader(ctx context.Context) (int, error) {
	ictx, cancel := context.WithTimeout(ctx, streamCurrentTimeout)
	defer cancel()
	s, err := f.js.Stream(ictx, streamName)
	if err != nil {
		return -1, fmt.Errorf("find the stream's leader: %w", err)
	}
	var leader string
	if cl := s.CachedInfo().Cluster; cl != nil {
		leader = cl.Leader
	}
	i := slices.IndexFunc(f.servers.procs, func(p *proc.Process) bool { return p.Name() == leader })
	if i < 0 {
		return -1, fmt.Errorf("find the stream's leader: %q is none of the servers", leader)
	}
	return i, nil
}

// machineFault injects power-loss, os-crash or corrupt-replica.
func (f *fleet) machineFault(ctx context.Context, fault string) (FaultRecord, error) {
	o := f.opts
	all := make([]int, len(f.servers.procs))
	for i := range all {
		all[i] = i
	}
	switch fault {
	case FaultPowerLoss:
		snaps, err := f.snapshot(all)
		if err != nil {
			return FaultRecord{}, err
		}
		if err := f.runner.Wait(ctx, o.Rollback); err != nil {
			return FaultRecord{}, err
		}
		before, _ := f.streamState(ctx)
		for _, i := range all {
			if err := f.servers.procs[i].Pause(); err != nil {
				return FaultRecord{}, err
			}
		}
		for _, p := range f.servers.procs {
			p.Kill()
		}
		for i, snap := range snaps {
			if err := soak.RestoreStore(f.servers.dirs[i], snap); err != nil {
				return FaultRecord{}, err
			}
		}
		repaired, current, err := f.startServers(ctx, f.servers.startAll)
		if err != nil {
			return FaultRecord{}, err
		}
		after, _ := f.streamState(ctx)
		return FaultRecord{
			Note: fmt.Sprintf("every server paused for a copy of its store; %v later every server killed and started with that copy, stream current %v after: its last sequence went from %d to %d",
				o.Rollback, roundDelay(current), before, after),
			Repaired: repaired,
		}, nil

	case FaultOSCrash:
		crashed, err := f.streamLeader(ctx)
		if err != nil {
			return FaultRecord{}, err
		}
		paused := (crashed + 1) % len(all)
		snaps, err := f.snapshot([]int{crashed})
		if err != nil {
			return FaultRecord{}, err
		}
		if err := f.runner.Wait(ctx, o.Rollback); err != nil {
			return FaultRecord{}, err
		}
		before, _ := f.streamState(ctx)
		if err := f.servers.procs[paused].Pause(); err != nil {
			return FaultRecord{}, err
		}
		f.servers.procs[crashed].Kill()
		if err := soak.RestoreStore(f.servers.dirs[crashed], snaps[crashed]); err != nil {
			return FaultRecord{}, err
		}
		restart := func(ctx context.Context) error { return f.servers.procs[crashed].StartReady(ctx, serverReadyTimeout) }
		if err := restart(ctx); err != nil {
			return FaultRecord{}, err
		}
		if err := f.runner.Wait(ctx, o.FaultLength); err != nil {
			return FaultRecord{}, err
		}
		if err := f.servers.procs[paused].Resume(); err != nil {
			return FaultRecord{}, err
		}
		repaired := time.Now()
		current, err := f.waitStreamCurrent(ctx)
		if err != nil {
			return FaultRecord{}, err
		}
		after, _ := f.streamState(ctx)
		return FaultRecord{
			Note: fmt.Sprintf("%s (the stream's leader) paused for a copy of its store; %v later %s paused, %s killed and started with that copy, %s resumed %v after; stream current %v after: its last sequence went from %d to %d",
				f.servers.procs[crashed].Name(), o.Rollback, f.servers.procs[paused].Name(), f.servers.procs[crashed].Name(),
				f.servers.procs[paused].Name(), o.FaultLength, roundDelay(current), before, after),
			Repaired: repaired,
		}, nil

	case FaultCorruptReplica:
		leader, err := f.streamLeader(ctx)
		if err != nil {
			return FaultRecord{}, err
		}
		i := (leader + 1) % len(all)
		before, msgsBefore := f.streamState(ctx)
		f.servers.procs[i].Kill()
		what, err := soak.CorruptNewestBlock(f.servers.dirs[i], streamName, rand.New(rand.NewPCG(o.Seed, uint64(i))))
		if err != nil {
			return FaultRecord{}, err
		}
		if err := f.servers.procs[i].StartReady(ctx, serverReadyTimeout); err != nil {
			return FaultRecord{}, err
		}
		if _, err := f.waitStreamCurrent(ctx); err != nil {
			return FaultRecord{}, err
		}
		// The leader restarts, so that another may lead.
		if _, err := f.servers.restart(ctx, leader); err != nil {
			return FaultRecord{}, err
		}
		repaired := time.Now()
		current, err := f.waitStreamCurrent(ctx)
		if err != nil {
			return FaultRecord{}, err
		}
		newLeader, _ := f.streamLeader(ctx)
		ledBy := "?"
		if newLeader >= 0 {
			ledBy = f.servers.procs[newLeader].Name()
		}
		after, msgsAfter := f.streamState(ctx)
		return FaultRecord{
			Note: fmt.Sprintf("%s killed, %s, started again; the leader %s restarted (SIGTERM), %s leads; stream current %v after: %d messages (last %d) before, %d (last %d) after",
				f.servers.procs[i].Name(), what, f.servers.procs[leader].Name(), ledBy, roundDelay(current), msgsBefore, before, msgsAfter, after),
			Repaired: repaired,
		}, nil
	}
	return FaultRecord{}, fmt.Errorf("unknown fault %q", fault)
}
