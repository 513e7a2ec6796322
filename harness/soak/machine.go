package soak

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Machine faults: the servers lose what they acknowledged.
//
// nats-server acknowledges a write once it is in its files' page cache and
// flushes them every sync_interval (2 minutes by default). A killed process
// loses nothing of that, since the page cache outlives it; a machine that
// loses power, or whose kernel crashes, loses what was not flushed. The
// soak's servers run in its own process, so it rolls a server's store back
// instead: it stops the server (a clean stop, which writes its files),
// copies the store as it is on disk, starts the server again, and after
// Options.Rollback of churn stops it and puts the copy back before it
// starts it again. Everything the server acknowledged in between is gone,
// as if nothing had been flushed for that long.
//
// What this models: a coordinated power loss (every server, power-loss),
// an OS crash of one server (os-crash) while another is down around its
// return, and a truncated or corrupted newest block file on one replica
// (corrupt-replica). What it does not: a partial flush (some files or
// blocks written, others not), torn pages, a file system losing metadata
// but not data, clocks that jump, a pause without a crash (the soak's
// in-process servers cannot be stopped with SIGSTOP: the "paused" server
// of os-crash is stopped instead; the fleet harness, whose servers are
// processes, pauses it), and the copy's own short outage at the fault's
// start (the servers are down for the copy, which clients see as a
// restart).

// snapshotStores stops the servers is, copies their stores into new
// directories under the run directory, and starts them again. It returns
// the copies, by server, and how long the servers were down.
func (s *soak) snapshotStores(is []int) (map[int]string, time.Duration, error) {
	down := time.Now()
	s.nats.stopTogether(is)
	snaps := map[int]string{}
	for _, i := range is {
		snap, err := CopyStore(s.nats.storeDir(i), s.opts.Dir)
		if err != nil {
			return nil, 0, err
		}
		snaps[i] = snap
	}
	if err := s.nats.start(is...); err != nil {
		return nil, 0, err
	}
	return snaps, time.Since(down), nil
}

// rollBack puts the copies of snaps back as the stores of their servers,
// which are stopped.
func (s *soak) rollBack(snaps map[int]string) error {
	for i, snap := range snaps {
		if err := RestoreStore(s.nats.storeDir(i), snap); err != nil {
			return err
		}
	}
	return nil
}

// CopyStore copies a stopped (or paused) server's store dir into a new
// directory under parent and returns it. The fleet harness's machine
// faults use it too.
func CopyStore(dir, parent string) (string, error) {
	snap, err := os.MkdirTemp(parent, "rollback-")
	if err != nil {
		return "", fmt.Errorf("make a directory for the copy of %s: %w", dir, err)
	}
	if err := os.CopyFS(snap, os.DirFS(dir)); err != nil {
		return "", fmt.Errorf("copy the store %s: %w", dir, err)
	}
	return snap, nil
}

// RestoreStore puts the copy snap back as the store dir of a stopped
// server, and removes the copy.
func RestoreStore(dir, snap string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove the store %s: %w", dir, err)
	}
	if err := os.CopyFS(dir, os.DirFS(snap)); err != nil {
		return fmt.Errorf("put the copy back as the store %s: %w", dir, err)
	}
	if err := os.RemoveAll(snap); err != nil {
		return fmt.Errorf("remove the copy %s: %w", snap, err)
	}
	return nil
}

// streamLast returns the stream's last sequence and message count, or
// zeros if it cannot be read within a few seconds.
func (s *soak) streamLast(ctx context.Context) (last, msgs uint64) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := s.js.Stream(ictx, streamName)
		if err == nil {
			info, ierr := st.Info(ictx)
			if ierr == nil {
				cancel()
				return info.State.LastSeq, info.State.Msgs
			}
		}
		cancel()
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, 0
		}
		if err := s.runner.Wait(ctx, 200*time.Millisecond); err != nil {
			return 0, 0
		}
	}
}

// injectMachineFault injects power-loss, os-crash or corrupt-replica.
func (s *soak) injectMachineFault(ctx context.Context, fault string) (string, error) {
	o := s.opts
	switch fault {
	case FaultPowerLoss:
		all := s.nats.indexes()
		snaps, copyDown, err := s.snapshotStores(all)
		if err != nil {
			return "", err
		}
		if err := s.runner.Wait(ctx, o.Rollback); err != nil {
			return "", err
		}
		before, _ := s.streamLast(ctx)
		s.nats.stopTogether(all)
		if err := s.rollBack(snaps); err != nil {
			return "", err
		}
		if err := s.nats.start(all...); err != nil {
			return "", err
		}
		after, _ := s.streamLast(ctx)
		note := fmt.Sprintf("every server's store copied (down %v for the copy); %v later every server stopped and came back with that copy: the stream's last sequence went from %d to %d",
			roundDelay(copyDown), o.Rollback, before, after)
		return note + s.bridgeRecovery(ctx), nil

	case FaultOSCrash:
		c := s.nats.cluster
		crashed := c.StreamLeader(natsAccount, streamName)
		if crashed < 0 {
			crashed = 0
		}
		paused := (crashed + 1) % len(s.nats.urls)
		snaps, copyDown, err := s.snapshotStores([]int{crashed})
		if err != nil {
			return "", err
		}
		if err := s.runner.Wait(ctx, o.Rollback); err != nil {
			return "", err
		}
		before, _ := s.streamLast(ctx)
		s.nats.stop(paused)
		s.nats.stop(crashed)
		if err := s.rollBack(snaps); err != nil {
			return "", err
		}
		if err := s.nats.start(crashed); err != nil {
			return "", err
		}
		if err := s.runner.Wait(ctx, o.FaultLength); err != nil {
			return "", err
		}
		if err := s.nats.start(paused); err != nil {
			return "", err
		}
		after, _ := s.streamLast(ctx)
		note := fmt.Sprintf("%s (the stream leader) copied (down %v for the copy); %v later it crashed and came back with that copy while %s was down for %v: the stream's last sequence went from %d to %d",
			s.serverName(crashed), roundDelay(copyDown), o.Rollback, s.serverName(paused), o.FaultLength, before, after)
		return note + s.bridgeRecovery(ctx), nil

	case FaultCorruptReplica:
		i := 0
		if c := s.nats.cluster; c != nil {
			// A replica that does not lead, then made to lead.
			i = (max(c.StreamLeader(natsAccount, streamName), 0) + 1) % len(s.nats.urls)
		}
		before, msgsBefore := s.streamLast(ctx)
		s.nats.stop(i)
		what, err := CorruptNewestBlock(s.nats.storeDir(i), streamName, s.rng())
		if err != nil {
			return "", err
		}
		if err := s.nats.start(i); err != nil {
			return "", err
		}
		led := ""
		if c := s.nats.cluster; c != nil {
			if err := s.runner.Wait(ctx, o.FaultLength); err != nil {
				return "", err
			}
			if l := c.StreamLeader(natsAccount, streamName); l >= 0 && l != i {
				c.Stop(l)
				if err := s.runner.Wait(ctx, o.FaultLength); err != nil {
					return "", err
				}
				led = fmt.Sprintf("; the leader %s stopped for %v so that another may lead: %s led", s.serverName(l), o.FaultLength,
					s.serverName(c.StreamLeader(natsAccount, streamName)))
				if err := c.Restart(l); err != nil {
					return "", err
				}
			}
		}
		after, msgsAfter := s.streamLast(ctx)
		note := fmt.Sprintf("%s stopped, %s, started again%s: the stream went from %d messages (last %d) to %d (last %d)",
			s.serverName(i), what, led, msgsBefore, before, msgsAfter, after)
		return note + s.bridgeRecovery(ctx), nil
	}
	return "", fmt.Errorf("unknown fault %q", fault)
}

// rng returns a random source seeded from the run's seed, for the faults'
// choices.
func (s *soak) rng() *rand.Rand {
	return rand.New(rand.NewPCG(s.opts.Seed, uint64(len(s.faults))))
}

// CorruptNewestBlock truncates the newest message block of stream under
// storeDir, a stopped server's store, to half its size, or flips a byte in
// its second half (chosen by rng), and says which.
func CorruptNewestBlock(storeDir, stream string, rng *rand.Rand) (string, error) {
	var newest string
	var newestInfo fs.FileInfo
	err := filepath.WalkDir(storeDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".blk") ||
			!strings.Contains(path, string(filepath.Separator)+stream+string(filepath.Separator)) {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if newestInfo == nil || info.ModTime().After(newestInfo.ModTime()) {
			newest, newestInfo = path, info
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("find the newest block of stream %s under %s: %w", stream, storeDir, err)
	}
	if newest == "" || newestInfo.Size() < 2 {
		return "", errors.New("corrupt a block: the stream has no block with data yet")
	}
	size := newestInfo.Size()
	rel, _ := filepath.Rel(storeDir, newest)
	if rng.IntN(2) == 0 {
		if err := os.Truncate(newest, size/2); err != nil {
			return "", fmt.Errorf("truncate %s: %w", newest, err)
		}
		return fmt.Sprintf("its newest block %s truncated from %d to %d bytes", rel, size, size/2), nil
	}
	f, err := os.OpenFile(newest, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", newest, err)
	}
	defer f.Close()
	at := size/2 + rng.Int64N(size-size/2)
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		return "", fmt.Errorf("read %s: %w", newest, err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, at); err != nil {
		return "", fmt.Errorf("write %s: %w", newest, err)
	}
	return fmt.Sprintf("a byte flipped at offset %d of its newest block %s (%d bytes)", at, rel, size), nil
}
