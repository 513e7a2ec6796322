package latencybench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// runRaw measures JetStream alone: PublishMsgAsync of the CloudEvent messages
// of containers going through start, stop and remove, encoded by the
// bridge's encoder (so of the bridge's message sizes), at the configured
// rate, on its own connection to the same server and stream. Each publish is
// timed from just before PublishMsgAsync to the ack's arrival in a goroutine
// waiting for it, as the publisher waits for its acks.
func (h *Harness) runRaw(ctx context.Context) (Result, error) {
	cfg := h.cfg
	nc, js, err := h.connect(string(ModeRaw))
	if err != nil {
		return Result{}, err
	}
	defer nc.Close()
	tr := newTracker(int(cfg.Rate * (cfg.Warmup + cfg.Duration).Seconds()))
	slots := max(3, int(math.Ceil(cfg.Rate*cfg.Dwell.Seconds())))
	events := newRawEvents(slots, cfg.ContainersPerPod)

	stop := make(chan struct{})
	var waiters sync.WaitGroup
	defer func() {
		close(stop)
		waiters.Wait()
	}()
	publishOne := func(measured bool) error {
		msg, err := h.enc.Encode(events.next())
		if err != nil {
			return err
		}
		e := tr.start(measured)
		paf, err := js.PublishMsgAsync(msg)
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		waiters.Go(func() {
			select {
			case <-paf.Ok():
				tr.settle(e, time.Now())
			case <-paf.Err(): // never acked: counted as lost
			case <-stop:
			}
		})
		return nil
	}
	stopTrace, err := h.startTrace(ModeRaw)
	if err != nil {
		return Result{}, err
	}
	p, err := pace(ctx, cfg.Rate, cfg.Warmup, cfg.Duration, publishOne)
	stopTrace()
	if err != nil {
		return Result{}, fmt.Errorf("measure raw JetStream: %w", err)
	}
	tr.finish()
	drain := time.NewTimer(cfg.DrainTimeout)
	defer drain.Stop()
	select {
	case <-tr.allAcked:
	case <-drain.C:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	return tr.result(ModeRaw, p), nil
}

// rawEvents makes the Lifecycle events the bridge would publish for a pool
// of container slots cycling through start, stop and remove, with the
// identity, image and timestamps the simulated runtime gives, and a new
// random container ID for every cycle, so that no message is a duplicate.
type rawEvents struct {
	pods        []generator.Pod
	imageRef    string
	slots       int
	n           int
	containerID string // of the current cycle
}

// rawImage is the simulated runtime's default image.
const rawImage = "registry.example/app:1.0"

func newRawEvents(slots, containersPerPod int) *rawEvents {
	pods := make([]generator.Pod, (slots+containersPerPod-1)/containersPerPod)
	for i := range pods {
		pods[i] = generator.Pod{UID: uuid.NewString(), Namespace: podNamespace, Name: fmt.Sprintf("bench-%d", i)}
	}
	sum := sha256.Sum256([]byte(rawImage))
	return &rawEvents{pods: pods, imageRef: "sha256:" + hex.EncodeToString(sum[:]), slots: slots}
}

func (r *rawEvents) next() generator.Event {
	n := r.n
	r.n++
	typ := generator.LifecycleEventTypes[n%3]
	if typ == generator.ContainerStarted {
		var b [32]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
		r.containerID = hex.EncodeToString(b[:])
	}
	slot := (n / 3) % r.slots
	now := time.Now()
	ev := generator.Event{
		Type: typ,
		Pod:  r.pods[slot%len(r.pods)],
		Container: generator.Container{
			ID:       r.containerID,
			Name:     fmt.Sprintf("c%d", slot/len(r.pods)),
			Image:    rawImage,
			ImageRef: r.imageRef,
		},
		StartedAt:  now,
		Time:       now,
		DetectedBy: generator.SourceEvented,
		ObservedAt: now,
	}
	code := int32(0)
	switch typ {
	case generator.ContainerStarted:
		ev.State = generator.StateRunning
	case generator.ContainerDied:
		ev.State, ev.ExitCode, ev.Reason, ev.FinishedAt = generator.StateExited, &code, "Completed", now
	case generator.ContainerRemoved:
		ev.State, ev.ExitCode, ev.FinishedAt = generator.StateRemoved, &code, now
	}
	return ev
}
