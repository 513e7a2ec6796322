package latencybench

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// The protocol between the harness (the parent) and the simulated runtime's
// process (the child, RuntimeProcess), which is the harness's executable
// re-executed with runtimeEnv set:
//
//   - The parent passes a runtimeSpec, in JSON, in runtimeEnv.
//   - The child writes runtimeRecords to its stdout, one JSON object a line:
//     recordListening once it serves CRI on the spec's socket; after "go",
//     a recordTransition for each transition it made, measured or not (one
//     whose runtime call failed is never reported), written out in batches
//     (recordFlushInterval); then one recordDone.
//   - The parent writes "go" and a newline to the child's stdin once the
//     bridge is ready, and closes the child's stdin to stop it. The child
//     keeps serving CRI until then, so that the bridge can relist while it
//     drains, and then exits with status 0. A child whose stdin ends
//     because the parent died exits too.
//   - The child's stderr is for its errors; the parent logs it.

// runtimeEnv names the environment variable that makes this executable the
// simulated runtime's process (MaybeRunRuntimeProcess).
const runtimeEnv = "PLEG_BENCH_RUNTIME"

// goCommand is the line the parent writes to the child's stdin to start the
// transitions.
const goCommand = "go"

// runtimeSpec is what the runtime's process needs of the harness's Config.
type runtimeSpec struct {
	Socket           string        `json:"socket"`
	Rate             float64       `json:"rate"`
	Warmup           time.Duration `json:"warmup"`
	Duration         time.Duration `json:"duration"`
	Slots            int           `json:"slots"`
	ContainersPerPod int           `json:"containers_per_pod"`
	// WaitSubscriber makes the child start its transitions only once the
	// bridge subscribed to its event stream (evented mode): the parent
	// cannot see the subscription, and the bridge's mode says "evented"
	// before the stream is open.
	WaitSubscriber bool `json:"wait_subscriber"`
	// Containerd17 runs the containerd 1.7 preset instead of 2.4's.
	Containerd17 bool `json:"containerd_17,omitempty"`
}

func (s runtimeSpec) validate() error {
	var errs []error
	if s.Socket == "" {
		errs = append(errs, errors.New("no socket"))
	}
	if s.Rate <= 0 {
		errs = append(errs, fmt.Errorf("rate %v: must be positive", s.Rate))
	}
	if s.Warmup < 0 || s.Duration <= 0 {
		errs = append(errs, fmt.Errorf("warmup %v, duration %v: must be positive", s.Warmup, s.Duration))
	}
	if s.Slots < 3 || s.ContainersPerPod <= 0 {
		errs = append(errs, fmt.Errorf("%d slots of %d a pod: want at least 3, and a positive number a pod", s.Slots, s.ContainersPerPod))
	}
	return errors.Join(errs...)
}

// recordKind is what a runtimeRecord reports.
type recordKind string

// Record kinds.
const (
	recordListening  recordKind = "listening"
	recordTransition recordKind = "transition"
	recordDone       recordKind = "done"
)

// runtimeRecord is one line of the child's stdout.
type runtimeRecord struct {
	Kind recordKind `json:"kind"`

	// recordTransition: the transition, and the child's wall clock in Unix
	// nanoseconds right before the runtime call that made it. The parent
	// reads the same clock (CLOCK_REALTIME) when the ack comes; a monotonic
	// reading would not cross the process boundary.
	ContainerID string                       `json:"container_id,omitempty"`
	EventType   generator.LifecycleEventType `json:"event_type,omitempty"`
	At          int64                        `json:"at,omitempty"`
	Measured    bool                         `json:"measured,omitempty"`

	// recordDone: the rate achieved while measuring, per second, and the
	// child's CPU use meanwhile, in cores (0 where unknown).
	Rate float64 `json:"rate,omitempty"`
	CPU  float64 `json:"cpu,omitempty"`
}

// maxQuoted bounds how much of a malformed line an error quotes.
const maxQuoted = 200

// parseRecord decodes and checks one line of the child's stdout.
func parseRecord(line []byte) (runtimeRecord, error) {
	var rec runtimeRecord
	err := json.Unmarshal(line, &rec)
	if err == nil {
		err = rec.validate()
	}
	if err != nil {
		if len(line) > maxQuoted {
			line = append(line[:maxQuoted:maxQuoted], "…"...)
		}
		return runtimeRecord{}, fmt.Errorf("malformed record %q: %w", line, err)
	}
	return rec, nil
}

func (r runtimeRecord) validate() error {
	switch r.Kind {
	case recordListening:
	case recordTransition:
		if r.ContainerID == "" || r.At <= 0 {
			return errors.New("a transition needs a container_id and a positive at")
		}
		switch r.EventType {
		case generator.ContainerStarted, generator.ContainerDied, generator.ContainerRemoved:
		default:
			return fmt.Errorf("unknown Lifecycle event type %q", r.EventType)
		}
	case recordDone:
		if r.Rate < 0 || r.CPU < 0 {
			return errors.New("negative rate or cpu")
		}
	default:
		return fmt.Errorf("unknown kind %q", r.Kind)
	}
	return nil
}
