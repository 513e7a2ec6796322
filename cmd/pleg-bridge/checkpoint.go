package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

const (
	// checkpointInterval keeps the file within a second of the acks it
	// records (DESIGN.md §7).
	checkpointInterval = 500 * time.Millisecond
	// checkpointKeepRemoved is how long a removed container stays in the
	// checkpoint: as long as the generator's tombstones, so that a stale
	// replay after a restart is recognised.
	checkpointKeepRemoved = generator.DefaultTombstoneTTL
	checkpointVersion     = 1
)

// checkpoint records what JetStream acknowledged, per container, in a file
// under PLEG_DATA_DIR, so that a restarted bridge neither re-publishes
// everything as new nor forgets what changed while it was down. OnAck is
// safe for concurrent use; Run owns the writing.
type checkpoint struct {
	path   string
	node   string
	logger *slog.Logger

	mu    sync.Mutex
	acked map[string][]checkpointEvent // guarded by mu; by container ID
	dirty bool                         // guarded by mu
}

// checkpointEvent is an acked event as the file keeps it.
type checkpointEvent struct {
	Type       generator.LifecycleEventType `json:"type"`
	PodUID     string                       `json:"podUID"`
	Namespace  string                       `json:"namespace,omitempty"`
	PodName    string                       `json:"podName,omitempty"`
	ID         string                       `json:"id"`
	Name       string                       `json:"name,omitempty"`
	Attempt    uint32                       `json:"attempt,omitempty"`
	Sandbox    bool                         `json:"sandbox,omitempty"`
	Image      string                       `json:"image,omitempty"`
	ImageRef   string                       `json:"imageRef,omitempty"`
	State      generator.State              `json:"state"`
	ExitCode   *int32                       `json:"exitCode,omitempty"`
	Reason     string                       `json:"reason,omitempty"`
	Message    string                       `json:"message,omitempty"`
	StartedAt  time.Time                    `json:"startedAt,omitzero"`
	FinishedAt time.Time                    `json:"finishedAt,omitzero"`
	Time       time.Time                    `json:"time,omitzero"`
	ObservedAt time.Time                    `json:"observedAt,omitzero"`
}

type checkpointFile struct {
	Version int                          `json:"version"`
	Node    string                       `json:"node"`
	Written time.Time                    `json:"written"`
	Acked   map[string][]checkpointEvent `json:"acked"`
}

func toCheckpoint(ev generator.Event) checkpointEvent {
	return checkpointEvent{
		Type: ev.Type, PodUID: ev.Pod.UID, Namespace: ev.Pod.Namespace, PodName: ev.Pod.Name,
		ID: ev.Container.ID, Name: ev.Container.Name, Attempt: ev.Container.Attempt, Sandbox: ev.Container.Sandbox,
		Image: ev.Container.Image, ImageRef: ev.Container.ImageRef, State: ev.State, ExitCode: ev.ExitCode,
		Reason: ev.Reason, Message: ev.Message, StartedAt: ev.StartedAt, FinishedAt: ev.FinishedAt,
		Time: ev.Time, ObservedAt: ev.ObservedAt,
	}
}

func (c checkpointEvent) event() generator.Event {
	return generator.Event{
		Type: c.Type, Pod: generator.Pod{UID: c.PodUID, Namespace: c.Namespace, Name: c.PodName},
		Container: generator.Container{ID: c.ID, Name: c.Name, Attempt: c.Attempt, Sandbox: c.Sandbox, Image: c.Image, ImageRef: c.ImageRef},
		State:     c.State, ExitCode: c.ExitCode, Reason: c.Reason, Message: c.Message,
		StartedAt: c.StartedAt, FinishedAt: c.FinishedAt, Time: c.Time, ObservedAt: c.ObservedAt,
	}
}

// openCheckpoint reads the checkpoint of node from dataDir, if any, and
// returns the events it records. A missing file is a first start; a file
// that cannot be read or belongs to another node is set aside with a
// warning, never fatal: the cost is re-publishing, which the event ids make
// harmless within the stream's duplicate window.
func openCheckpoint(dataDir, node string, logger *slog.Logger) (*checkpoint, []generator.Event) {
	c := &checkpoint{
		path:   filepath.Join(dataDir, "checkpoint.json"),
		node:   node,
		logger: logger.With("component", "checkpoint"),
		acked:  map[string][]checkpointEvent{},
	}
	data, err := os.ReadFile(c.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.logger.Info("no checkpoint: first start reports what is running", "path", c.path)
		return c, nil
	case err != nil:
		c.logger.Warn("cannot read checkpoint, starting without it", "path", c.path, "err", err)
		return c, nil
	}
	var f checkpointFile
	if err := json.Unmarshal(data, &f); err != nil || f.Version != checkpointVersion || f.Node != node {
		c.logger.Warn("ignoring checkpoint", "path", c.path, "err", err, "version", f.Version, "checkpoint_node", f.Node, "node", node)
		return c, nil
	}
	var events []generator.Event
	for id, evs := range f.Acked {
		c.acked[id] = evs
		for _, e := range evs {
			events = append(events, e.event())
		}
	}
	c.logger.Info("restored checkpoint", "path", c.path, "containers", len(f.Acked), "written", f.Written)
	return c, events
}

// OnAck records an event JetStream acknowledged.
func (c *checkpoint) OnAck(ev generator.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.acked[ev.Container.ID] = append(c.acked[ev.Container.ID], toCheckpoint(ev))
	c.dirty = true
}

// Run writes the checkpoint every checkpointInterval while acks came in,
// until ctx is done, then writes it a last time.
func (c *checkpoint) Run(ctx context.Context) error {
	t := time.NewTicker(checkpointInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			if err := c.write(time.Now()); err != nil {
				c.logger.Warn("write final checkpoint", "err", err)
			}
			return nil
		case now := <-t.C:
			err := c.write(now)
			switch {
			case err != nil && !failing:
				c.logger.Warn("cannot write checkpoint; a restart will re-publish what is running", "err", err)
			case err == nil && failing:
				c.logger.Info("checkpoint written again")
			}
			failing = err != nil
		}
	}
}

// write saves the checkpoint if it changed, atomically (temporary file,
// fsync, rename), dropping containers removed long ago.
func (c *checkpoint) write(now time.Time) error {
	c.mu.Lock()
	if !c.dirty {
		c.mu.Unlock()
		return nil
	}
	for id, evs := range c.acked {
		last := evs[len(evs)-1]
		if last.Type == generator.ContainerRemoved && now.Sub(last.ObservedAt) > checkpointKeepRemoved {
			delete(c.acked, id)
		}
	}
	data, err := json.Marshal(checkpointFile{Version: checkpointVersion, Node: c.node, Written: now.UTC(), Acked: c.acked})
	c.dirty = false
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	if err := writeFileAtomic(c.path, data); err != nil {
		c.mu.Lock()
		c.dirty = true
		c.mu.Unlock()
		return err
	}
	return nil
}

func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("create checkpoint directory: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".checkpoint-*")
	if err != nil {
		return fmt.Errorf("create checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace checkpoint: %w", err)
	}
	return nil
}
