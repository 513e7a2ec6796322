package latencybench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"
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
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stdout  io.Reader
	records *bufio.Scanner // of stdout
	stderr  *stderrLog
	// stop closes the process's stdin, which stops it, and kills it if it
	// has not exited runtimeStopGrace later. It may be called more than
	// once, from any goroutine.
	stop context.CancelFunc
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
	pctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	cmd := exec.CommandContext(pctx, exe)
	cmd.Env = env
	stdin, err := cmd.StdinPipe()
	if err != nil {
		stop()
		return nil, fmt.Errorf("start the runtime process: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stop()
		return nil, fmt.Errorf("start the runtime process: %w", err)
	}
	p := &runtimeProcess{
		cmd: cmd, stdin: stdin, stdout: stdout, records: bufio.NewScanner(stdout),
		stderr: &stderrLog{logger: logger.With("component", "runtime-process")},
		stop:   stop, finished: make(chan struct{}),
	}
	cmd.Stderr = p.stderr
	// Closing stdin is the protocol's stop; the kill after WaitDelay is for
	// a process that does not listen.
	cmd.Cancel = stdin.Close
	cmd.WaitDelay = runtimeStopGrace
	if err := cmd.Start(); err != nil {
		stop()
		return nil, fmt.Errorf("start the runtime process: %w", err)
	}

	deadline := time.AfterFunc(runtimeListenTimeout, p.stop)
	unhook := context.AfterFunc(ctx, p.stop)
	rec, err := p.next()
	timedOut, canceled := !deadline.Stop(), !unhook()
	switch {
	case timedOut:
		err = fmt.Errorf("no %q record within %v", recordListening, runtimeListenTimeout)
	case canceled:
		err = ctx.Err()
	case errors.Is(err, io.EOF):
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
	// The bridge's process's CPU use is read from the first measured record
	// to the last: about the runtime's measuring window, a pipe's lag later.
	var measuring time.Time
	var cpu0 time.Duration
	const what = "read the runtime process's records"
	for {
		rec, err := p.next()
		if errors.Is(err, io.EOF) {
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
	_, werr := io.WriteString(p.stdin, goCommand+"\n")
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

// next reads the next record; io.EOF at the end of the process's stdout.
func (p *runtimeProcess) next() (runtimeRecord, error) {
	if !p.records.Scan() {
		if err := p.records.Err(); err != nil {
			return runtimeRecord{}, err
		}
		return runtimeRecord{}, io.EOF
	}
	return parseRecord(p.records.Bytes())
}

// fail stops and reaps the process after err, and returns err in context.
func (p *runtimeProcess) fail(what string, err error) error {
	p.stop()
	_, status := p.reap()
	return fmt.Errorf("%s: %w (runtime process %s)", what, err, status)
}

// reap waits for the process to exit, reading what is left of its stdout so
// that it cannot block writing, and says whether it exited with status 0
// and how it ended: its exit status and the end of its stderr.
func (p *runtimeProcess) reap() (bool, string) {
	_, _ = io.Copy(io.Discard, p.stdout)
	waitErr := p.cmd.Wait()
	p.stop() // releases the process's context if it exited by itself
	st := p.cmd.ProcessState
	var status string
	var exitErr *exec.ExitError
	switch {
	case st == nil:
		status = fmt.Sprintf("not reaped: %v", waitErr)
	case waitErr != nil && !errors.As(waitErr, &exitErr) && !errors.Is(waitErr, context.Canceled):
		// exec.ErrWaitDelay: killed after runtimeStopGrace.
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
