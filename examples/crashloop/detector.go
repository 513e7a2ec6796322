package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// DetectorOptions configure a Detector.
type DetectorOptions struct {
	// Bucket is the KV bucket holding each pod's recent crashes, "crashloop"
	// if empty. Every replica of the service uses the same bucket.
	Bucket string
	// Window is the sliding window, by the events' own times, over which
	// crashes are counted; 10 minutes if zero.
	Window time.Duration
	// Threshold is how many crashes within Window make a crash loop; 3 if
	// zero.
	Threshold int
	// Replicas is the bucket's replica count; 0 means 1.
	Replicas int
	// OnReport is called for each crash that puts its pod at or over the
	// threshold. Required. It is called from the handler's goroutines, so
	// it must be safe for concurrent use. A report may come twice: a
	// redelivered event is not counted again, but it is reported again.
	OnReport func(Report)
}

// Report says that a pod crashed Crashes times within the window that ends
// with the crash of Container at Time.
type Report struct {
	PodUID    string
	Namespace string
	Pod       string
	Container string
	ExitCode  int32
	Reason    string
	Time      time.Time
	Crashes   int
	Window    time.Duration
	// Sequence is the event stream sequence of the crash.
	Sequence uint64
}

// Detector counts the non-zero exits of each pod's containers (sandboxes
// left out) over a sliding window and reports pods at or over a threshold.
// Its state lives in a JetStream KV bucket, one key per pod, so that a
// restarted or another replica carries on with the same counts; each crash
// is stored with its stream sequence, so a redelivered event is counted
// once. It relies on consumer.Consume handling one pod's events one at a
// time; then no two writers race for a key. It is safe for concurrent use.
type Detector struct {
	kv   jetstream.KeyValue
	opts DetectorOptions
}

// crashRecord is what the bucket holds for a pod: its crashes within the
// window, oldest first.
type crashRecord struct {
	Namespace string  `json:"namespace"`
	Pod       string  `json:"pod"`
	Crashes   []crash `json:"crashes"`
}

type crash struct {
	Sequence  uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Container string    `json:"container"`
	ExitCode  int32     `json:"exitCode"`
}

// NewDetector creates or opens the bucket and returns a Detector. The
// bucket's keys expire one window after their last write, so pods that
// stopped crashing cost nothing.
func NewDetector(ctx context.Context, js jetstream.JetStream, opts DetectorOptions) (*Detector, error) {
	opts.Bucket = cmp.Or(opts.Bucket, "crashloop")
	opts.Window = cmp.Or(opts.Window, 10*time.Minute)
	opts.Threshold = cmp.Or(opts.Threshold, 3)
	switch {
	case opts.OnReport == nil:
		return nil, errors.New("create detector: OnReport is nil")
	case opts.Window < 0:
		return nil, fmt.Errorf("create detector: window %s is negative", opts.Window)
	case opts.Threshold < 1:
		return nil, fmt.Errorf("create detector: threshold %d is below 1", opts.Threshold)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      opts.Bucket,
		Description: "crash-loop detector: recent non-zero exits per pod",
		TTL:         opts.Window,
		History:     1,
		Replicas:    opts.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("create detector: open bucket %s: %w", opts.Bucket, err)
	}
	return &Detector{kv: kv, opts: opts}, nil
}

// Handle is the consumer.Handler of the detector. It counts a ContainerDied
// event with a non-zero exit code of a container (not a sandbox) unless its
// sequence is counted already, and reports the pod if it is at or over the
// threshold. It returns an error if the bucket cannot be read or written;
// the event is then delivered again.
func (d *Detector) Handle(ctx context.Context, e consumer.Event) error {
	code, _ := e.ExitCode()
	if e.LifecycleType() != "ContainerDied" || e.Data.Container.Sandbox || code == 0 {
		return nil
	}
	key := podKey(e.PodUID)
	var (
		rec crashRecord
		rev uint64
	)
	entry, err := d.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return fmt.Errorf("read crashes of pod %s: %w", e.PodUID, err)
	default:
		rev = entry.Revision()
		if err := json.Unmarshal(entry.Value(), &rec); err != nil {
			return fmt.Errorf("decode crashes of pod %s: %w", e.PodUID, err)
		}
	}

	if !slices.ContainsFunc(rec.Crashes, func(c crash) bool { return c.Sequence == e.Sequence }) {
		rec.Namespace, rec.Pod = e.Data.Pod.Namespace, e.Data.Pod.Name
		rec.Crashes = append(rec.Crashes, crash{
			Sequence: e.Sequence, Time: e.Time, Container: e.Data.Container.Name, ExitCode: code,
		})
		slices.SortFunc(rec.Crashes, func(a, b crash) int { return a.Time.Compare(b.Time) })
		latest := rec.Crashes[len(rec.Crashes)-1].Time
		rec.Crashes = slices.DeleteFunc(rec.Crashes, func(c crash) bool { return !c.Time.After(latest.Add(-d.opts.Window)) })
		if err := d.store(ctx, key, rev, rec); err != nil {
			return fmt.Errorf("store crashes of pod %s: %w", e.PodUID, err)
		}
	}

	// Count the crashes in the window that ends with this one, also when
	// it was counted before: then the report that followed may have been
	// lost with the acknowledgement.
	n := 0
	for _, c := range rec.Crashes {
		if !c.Time.After(e.Time) && c.Time.After(e.Time.Add(-d.opts.Window)) {
			n++
		}
	}
	if n >= d.opts.Threshold {
		d.opts.OnReport(Report{
			PodUID: e.PodUID, Namespace: e.Data.Pod.Namespace, Pod: e.Data.Pod.Name,
			Container: e.Data.Container.Name, ExitCode: code, Reason: e.Data.Reason,
			Time: e.Time, Crashes: n, Window: d.opts.Window, Sequence: e.Sequence,
		})
	}
	return nil
}

// store writes rec, refusing to overwrite a revision other than rev (0:
// the key must not exist).
func (d *Detector) store(ctx context.Context, key string, rev uint64, rec crashRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = d.kv.Create(ctx, key, b)
	} else {
		_, err = d.kv.Update(ctx, key, b, rev)
	}
	return err
}

// Crashes returns the stream sequences of the crashes the detector holds
// for a pod, oldest first.
func (d *Detector) Crashes(ctx context.Context, podUID string) ([]uint64, error) {
	entry, err := d.kv.Get(ctx, podKey(podUID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read crashes of pod %s: %w", podUID, err)
	}
	var rec crashRecord
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		return nil, fmt.Errorf("decode crashes of pod %s: %w", podUID, err)
	}
	var seqs []uint64
	for _, c := range rec.Crashes {
		seqs = append(seqs, c.Sequence)
	}
	return seqs, nil
}

// podKey is the bucket key of a pod: its UID where the UID is a valid key
// (Kubernetes UIDs always are), else "_" and the UID in hex: '_' is a valid
// key byte that no plain key holds, so the two forms never collide.
func podKey(uid string) string {
	for i := 0; i < len(uid); i++ {
		c := uid[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return "_" + hex.EncodeToString([]byte(uid))
		}
	}
	if uid == "" {
		return "_"
	}
	return uid
}
