package latencybench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// runtimeListenTimeout bounds the wait for the runtime's process to serve
// CRI: it builds the pool first, a few thousand containers at most.
const runtimeListenTimeout = 30 * time.Second

// runtimeStopGrace is how long the runtime's process has to exit once its
// stdin is closed before it is killed: more than the 5 s its CRI server
// gives the calls in flight.
const runtimeStopGrace = 10 * time.Second

// maxStderrTail is how much of the end of the runtime's process's stderr
// an error quotes.
const maxStderrTail = 512

// runtimeProcess is the harness's handle on the simulated runtime's process
// (RuntimeProcess): the same executable, re-executed, which serves CRI on a
// unix socket and makes the transitions, reporting each on its stdout (see
// protocol.go). Its methods other than stop must be called from one
// goroutine each: run reads the records, drive waits for the last.
type runtimeProcess struct {
	proc   *proc.Process
	stderr *stderrLog
	// finished is closed once the process reported its last transition;
	// summary is set before.
	finished chan struct{}
	summary  paced
}

// runtimeProcessEnv is the environment of the runtime's process for spec:
// this process's, and spec in runtimeEnv.
func runtimeProcessEnv(spec runtimeSpec) ([]string, error) {
	if os.Getenv(runtimeEnv) != "" {
		return nil, fmt.Errorf("%s is set in the harness's own process: the executable "+
			"must call latencybench.MaybeRunRuntimeProcess first thing in main (tests: in TestMain)", runtimeEnv)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	return append(os.Environ(), runtimeEnv+"="+string(b)), nil
}

// startRuntimeProcess re-executes this executable with env (see
// runtimeProcessEnv), and returns once the process reported that it serves
// CRI. ctx bounds only that wait: the process then runs until run's ctx is
// done. The process's stderr goes to logger, a line at a time. The error
// says what went wrong, with the process's exit status and the end of its
// stderr; the process is then gone.
func startRuntimeProcess(ctx context.Context, env []string, logger *slog.Logger) (*runtimeProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("start the runtime process: find this executable: %w", err)
	}
	p := &runtimeProcess{
		stderr:   &stderrLog{logger: logger.With("component", "runtime-process")},
		finished: make(chan struct{}),
	}
	// Closing stdin is the protocol's stop; the kill runtimeStopGrace later
	// is for a process that does not listen.
	p.proc = proc.New("runtime process", []string{exe}, proc.Options{
		Env: env, Stderr: p.stderr, Lines: true, StopTimeout: runtimeStopGrace,
	})
	if err := p.proc.Start(); err != nil {
		return nil, fmt.Errorf("start the runtime process: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, runtimeListenTimeout)
	defer cancel()
	rec, err := p.next(lctx)
	switch {
	case err != nil && ctx.Err() != nil:
		err = ctx.Err()
	case err != nil && lctx.Err() != nil:
		err = fmt.Errorf("no %q record within %v", recordListening, runtimeListenTimeout)
	case errors.Is(err, proc.ErrExited):
		err = errors.New("it ended before it listened")
	case err == nil && rec.Kind != recordListening:
		err = fmt.Errorf("a %q record first, want %q", rec.Kind, recordListening)
	}
	if err != nil {
		return nil, p.fail("start the runtime process", err)
	}
	return p, nil
}

// run feeds the records of the runtime's process to tr until the process's
// stdout ends, and then reaps the process. Once ctx is done it stops the
// process; a process that reported its last transition keeps serving CRI
// until then. run returns nil if the process, having reported its last
// transition or been stopped, exited with status 0. Otherwise its error
// says what went wrong (a malformed record, an early end), with the
// process's exit status and the end of its stderr; the process is then
// gone.
func (p *runtimeProcess) run(ctx context.Context, tr *tracker) error {
	defer context.AfterFunc(ctx, p.stop)()
	// The reads are not bounded by ctx: the stop its end brings ends the
	// process's stdout, and with it the loop.
	rctx := context.WithoutCancel(ctx)
	// The bridge's process's CPU use is read from the first measured record
	// to the last: about the runtime's measuring window, a pipe's lag later.
	var measuring time.Time
	var cpu0 time.Duration
	const what = "read the runtime process's records"
	for {
		rec, err := p.next(rctx)
		if errors.Is(err, proc.ErrExited) {
			break
		}
		if err != nil {
			return p.fail(what, err)
		}
		switch rec.Kind {
		case recordTransition:
			if rec.Measured && measuring.IsZero() {
				measuring, cpu0 = time.Now(), processCPU()
			}
			if err := tr.record(transition{rec.ContainerID, rec.EventType}, time.Unix(0, rec.At), rec.Measured); err != nil {
				return p.fail(what, err)
			}
		case recordDone:
			select {
			case <-p.finished:
				return p.fail(what, errors.New("a second done record"))
			default:
			}
			p.summary = paced{rate: rec.Rate, runtimeCPU: rec.CPU}
			if cpu0 > 0 {
				p.summary.cpu = (processCPU() - cpu0).Seconds() / time.Since(measuring).Seconds()
			}
			close(p.finished)
		case recordListening:
			return p.fail(what, errors.New("a second listening record"))
		}
	}
	ok, status := p.reap()
	select {
	case <-p.finished:
	default:
		if ctx.Err() == nil {
			return fmt.Errorf("the runtime process ended before it reported its last transition (%s)", status)
		}
	}
	if !ok {
		return fmt.Errorf("the runtime process failed (%s)", status)
	}
	return nil
}

// drive tells the runtime's process to make its transitions, and returns
// what it reported of them (and the bridge's process's CPU use meanwhile)
// once run has read its last. It returns an error if ctx is done or timeout
// passes first.
func (p *runtimeProcess) drive(ctx context.Context, timeout time.Duration) (paced, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	// A failed write means the process is gone, or going: run reports how
	// it ended, and its error ends ctx.
	werr := p.proc.Send(goCommand)
	select {
	case <-p.finished:
		return p.summary, nil
	case <-ctx.Done():
		return paced{}, ctx.Err()
	case <-t.C:
		if werr != nil {
			return paced{}, fmt.Errorf("tell the runtime process to go: %w", werr)
		}
		return paced{}, fmt.Errorf("the runtime process did not report its last transition within %v", timeout)
	}
}

// next reads the next record; an error that wraps proc.ErrExited once the
// process's stdout ended and it exited.
func (p *runtimeProcess) next(ctx context.Context) (runtimeRecord, error) {
	line, err := p.proc.Next(ctx, 0)
	if err != nil {
		return runtimeRecord{}, err
	}
	return parseRecord([]byte(line))
}

// stop closes the process's stdin, which stops it, and kills it if it has
// not exited runtimeStopGrace later; it returns once the process is gone.
// It may be called more than once, from any goroutine: reap says how the
// process ended.
func (p *runtimeProcess) stop() { _ = p.proc.Stop(proc.CloseStdin) }

// fail stops and reaps the process after err, and returns err in context.
func (p *runtimeProcess) fail(what string, err error) error {
	p.stop()
	_, status := p.reap()
	return fmt.Errorf("%s: %w (runtime process %s)", what, err, status)
}

// reap waits for the process to exit and says whether it exited with
// status 0 and how it ended: its exit status and the end of its stderr.
// Lines it writes once stopped are dropped, so it cannot block writing.
func (p *runtimeProcess) reap() (bool, string) {
	st, waitErr := p.proc.Wait()
	var status string
	var exitErr *exec.ExitError
	switch {
	case st == nil:
		status = fmt.Sprintf("not reaped: %v", waitErr)
	case waitErr != nil && !errors.As(waitErr, &exitErr):
		status = fmt.Sprintf("%v, %v", st, waitErr)
	default:
		status = st.String()
	}
	if tail := p.stderr.tail(); tail != "" {
		status += fmt.Sprintf(", stderr ending %q", tail)
	}
	return st != nil && st.Success(), status
}

// stderrLog passes the runtime process's stderr to a logger, a line at a
// time at Warn, and keeps its end for errors. exec.Cmd writes to it from
// one goroutine, and Wait waits for that goroutine: tail may be called once
// Wait returned.
type stderrLog struct {
	logger  *slog.Logger
	partial []byte // the line being written
	end     []byte // the last maxStderrTail bytes
}

// Write implements io.Writer.
func (l *stderrLog) Write(b []byte) (int, error) {
	l.end = append(l.end, b...)
	if len(l.end) > maxStderrTail {
		l.end = append(l.end[:0], l.end[len(l.end)-maxStderrTail:]...)
	}
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.logger.Warn("runtime process stderr", "line", string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	return len(b), nil
}

// tail returns the end of what was written, trimmed.
func (l *stderrLog) tail() string {
	return strings.TrimSpace(string(l.end))
}
