package latencybench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pleg-bridge/pleg-bridge/crisim"
)

// MaybeRunRuntimeProcess makes this process the simulated runtime's process
// of a Harness in the RuntimeProcess topology, if the Harness started it
// (the environment variable PLEG_BENCH_RUNTIME is set), and then exits: with
// status 0 once the Harness closes its stdin, with status 1 and the error on
// stderr if it fails. Otherwise it returns at once. A Harness starts that
// process by re-executing its own executable, so the executable's main, and
// TestMain in tests, must call it first thing. It is the one function of
// this package that calls os.Exit: the process's work ends there.
func MaybeRunRuntimeProcess() {
	spec := os.Getenv(runtimeEnv)
	if spec == "" {
		return
	}
	// The Harness decides when the runtime stops: after the bridge, which
	// may relist it while it drains. On Linux the process has a group of
	// its own (harness/proc), which a terminal's Ctrl-C does not reach;
	// elsewhere it shares the Harness's.
	signal.Ignore(os.Interrupt)
	if err := runRuntimeProcess(context.Background(), spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pleg-bench runtime process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// errStdinClosed is how the runtime's process learns to stop: the parent
// closed its stdin, or died.
var errStdinClosed = errors.New("stdin closed")

// runRuntimeProcess is the runtime's process (see protocol.go): the
// simulated runtime and its pool, as in the in-process topology, served over
// the spec's unix socket, and the driver, started by "go" on stdin and
// reporting its transitions as records on stdout. It blocks until stdin
// ends, then stops serving, and returns nil; or returns the first error.
func runRuntimeProcess(ctx context.Context, specJSON string, stdin io.Reader, stdout io.Writer) error {
	var spec runtimeSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fmt.Errorf("read %s: %w", runtimeEnv, err)
	}
	if err := spec.validate(); err != nil {
		return fmt.Errorf("read %s: %w", runtimeEnv, err)
	}
	preset := crisim.Containerd24Options()
	if spec.Containerd17 {
		preset = crisim.Containerd17Options()
	}
	model := crisim.NewRuntime(preset)
	w := newRecordWriter(stdout)
	pool, err := newPool(model, spec.Slots, spec.ContainersPerPod, w.track)
	if err != nil {
		return err
	}
	lis, err := crisim.Listen(spec.Socket)
	if err != nil {
		return err
	}
	sim := crisim.NewServer(model, crisim.ServerOptions{})

	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	start := make(chan struct{})
	// Not joined: a read from a pipe cannot be interrupted. It ends with
	// stdin, which is what ends the work below; after a failure, the process
	// exits and takes it along.
	go readCommands(stdin, start, stop)

	eg, egctx := errgroup.WithContext(ctx)
	eg.Go(func() error {
		// Once stopping, an error is the stop's: a Serve that begins after
		// its ctx ended reports the server stopped.
		return stoppedOr(egctx, sim.Serve(egctx, lis))
	})
	eg.Go(func() error {
		if err := w.write(runtimeRecord{Kind: recordListening}); err != nil {
			return err
		}
		select {
		case <-start:
		case <-egctx.Done():
			return nil
		}
		if spec.WaitSubscriber {
			err := pollUntil(egctx, func() bool { st := model.Stats(); return st.Subscribers+st.TaskSubscribers > 0 },
				"the bridge did not subscribe to the event stream within "+readyTimeout.String())
			if err != nil {
				return stoppedOr(egctx, err)
			}
		}
		p, err := pace(egctx, spec.Rate, spec.Warmup, spec.Duration, pool.transition)
		if err != nil {
			return stoppedOr(egctx, err)
		}
		// Serve goes on until stdin ends: the bridge relists while it drains.
		return w.write(runtimeRecord{Kind: recordDone, Rate: p.rate, CPU: p.cpu})
	})
	err = eg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, errStdinClosed) && !errors.Is(cause, context.Canceled) {
		return cause // a bad command, or stdin failing
	}
	return err
}

// stoppedOr returns nil if ctx is done (the parent stopped the process, or
// another goroutine failed and reports it), else err.
func stoppedOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// readCommands reads the parent's commands from stdin: goCommand closes
// start, the end of stdin stops the process with errStdinClosed, and
// anything else with an error.
func readCommands(stdin io.Reader, start chan<- struct{}, stop context.CancelCauseFunc) {
	sc := bufio.NewScanner(stdin)
	started := false
	for sc.Scan() {
		if sc.Text() != goCommand || started {
			stop(fmt.Errorf("unexpected command %q on stdin", sc.Text()))
			return
		}
		started = true
		close(start)
	}
	if err := sc.Err(); err != nil {
		stop(fmt.Errorf("read stdin: %w", err))
		return
	}
	stop(errStdinClosed)
}

// recordFlushInterval is how long transition records may wait in the
// runtime's process before they are written out. A record carries its own
// time stamp and the tracker keeps the acks that come first, so a late
// record costs the measurement nothing; writing records in batches spares
// the bridge's process a pipe wakeup per transition (10 records a write at
// 1,000 transitions/s).
const recordFlushInterval = 10 * time.Millisecond

// recordWriter writes the runtime's process's records to its stdout, one
// JSON object a line. Only the driver's goroutine uses it.
type recordWriter struct {
	buf     *bufio.Writer
	enc     *json.Encoder
	flushed time.Time // the last write to stdout
}

func newRecordWriter(w io.Writer) *recordWriter {
	buf := bufio.NewWriter(w)
	return &recordWriter{buf: buf, enc: json.NewEncoder(buf)}
}

// write writes rec, and everything before it, now.
func (w *recordWriter) write(rec runtimeRecord) error {
	return w.writeAt(rec, time.Time{})
}

// writeAt buffers rec, and writes the buffer out unless the last write was
// less than recordFlushInterval before now; the zero now writes at once.
func (w *recordWriter) writeAt(rec runtimeRecord, now time.Time) error {
	if err := w.enc.Encode(rec); err != nil {
		return fmt.Errorf("write %s record: %w", rec.Kind, err)
	}
	if !now.IsZero() && now.Sub(w.flushed) < recordFlushInterval {
		return nil
	}
	if err := w.buf.Flush(); err != nil {
		return fmt.Errorf("write %s record: %w", rec.Kind, err)
	}
	w.flushed = now
	return nil
}

// track is the driver's trackFunc in the runtime's process: it makes tr with
// call, timed right before the call, and reports it once the call
// succeeded, so that the record costs the measured latency nothing. A
// transition whose call failed is never reported, which withdraws it. The
// record may wait up to recordFlushInterval; the last one goes out with the
// done record.
func (w *recordWriter) track(tr transition, measured bool, call func() error) error {
	at := time.Now()
	if err := call(); err != nil {
		return err
	}
	return w.writeAt(runtimeRecord{
		Kind: recordTransition, ContainerID: tr.containerID, EventType: tr.typ,
		At: at.UnixNano(), Measured: measured,
	}, at)
}
