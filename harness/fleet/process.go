package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// stopTimeout bounds a graceful stop of a child: the bridges' drain
// (publish.DefaultDrainTimeout, 10 s) and some.
const stopTimeout = 30 * time.Second

// requestTimeout bounds one answer of a child to a request on its stdin.
const requestTimeout = 10 * time.Second

// linesBuffered is how many lines of a child's stdout wait for the reader:
// a child writes one line per request, and "ready" once.
const linesBuffered = 16

// process is one child process of the fleet, a server or a group of
// bridges, started again after each kill with the same spec. It talks the
// child protocol of RunChild: a line "ready" on its stdout once it is in
// its steady state, then one JSON line answering each line written to its
// stdin; it stops when its stdin ends (or on SIGTERM). Its stderr goes to
// a log file that each incarnation appends to.
//
// Its methods are safe for concurrent use; requests are serialized.
type process struct {
	name    string
	command []string
	env     []string
	logPath string

	reqMu sync.Mutex // held during a request, so answers match requests

	mu  sync.Mutex
	cur *incarnation // the last one started; guarded by mu
}

// incarnation is one run of a child process.
type incarnation struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string   // the child's stdout, line by line; closed at EOF
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's result, set before exited is closed
	ended  bool          // the harness killed or stopped it; guarded by process.mu
	ready  bool          // it wrote "ready"; guarded by process.mu
}

func newProcess(name string, command []string, spec childSpec, logPath string) (*process, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode the spec of %s: %w", name, err)
	}
	env := append(os.Environ(), ChildEnv+"="+string(b))
	return &process{name: name, command: command, env: env, logPath: logPath}, nil
}

// start starts an incarnation and waits until it writes "ready", for
// timeout at most. It never leaves a process behind on error.
func (p *process) start(ctx context.Context, timeout time.Duration) error {
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open the log of %s: %w", p.name, err)
	}
	cmd := exec.Command(p.command[0], p.command[1:]...)
	cmd.Env = p.env
	cmd.Stderr = log
	setDeathSignal(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s (%s): %w", p.name, p.command[0], err)
	}
	inc := &incarnation{cmd: cmd, stdin: stdin, lines: make(chan string, linesBuffered), exited: make(chan struct{})}
	// Both end with the process: the reader at EOF of its stdout, which
	// Wait waits for.
	go func() {
		defer close(inc.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			inc.lines <- sc.Text()
		}
	}()
	go func() {
		inc.err = cmd.Wait()
		log.Close()
		close(inc.exited)
	}()
	p.mu.Lock()
	p.cur = inc
	p.mu.Unlock()
	if _, err := p.next(ctx, inc, timeout); err != nil {
		p.kill()
		return fmt.Errorf("wait for %s to be ready: %w", p.name, err)
	}
	p.mu.Lock()
	inc.ready = true
	p.mu.Unlock()
	return nil
}

// next returns the next line of inc's stdout, waiting timeout at most.
func (p *process) next(ctx context.Context, inc *incarnation, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-inc.lines:
		if !ok {
			<-inc.exited
			return "", fmt.Errorf("%s exited: %v (log: %s)", p.name, inc.err, p.logPath)
		}
		return line, nil
	case <-t.C:
		return "", fmt.Errorf("%s: no answer within %v (log: %s)", p.name, timeout, p.logPath)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// request writes req as a line to the current incarnation's stdin and
// decodes its answer into out. It fails at once if no process runs or the
// one that runs is not ready yet: until then its stdout is start's.
func (p *process) request(ctx context.Context, req string, out any) error {
	p.reqMu.Lock()
	defer p.reqMu.Unlock()
	p.mu.Lock()
	inc := p.cur
	ready := inc != nil && inc.ready
	p.mu.Unlock()
	if !ready {
		return fmt.Errorf("%s is not running", p.name)
	}
	select {
	case <-inc.exited:
		return fmt.Errorf("%s is not running", p.name)
	default:
	}
	if _, err := io.WriteString(inc.stdin, req+"\n"); err != nil {
		return fmt.Errorf("ask %s: %w", p.name, err)
	}
	line, err := p.next(ctx, inc, requestTimeout)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(line), out); err != nil {
		return fmt.Errorf("read the answer of %s: %w", p.name, err)
	}
	return nil
}

func (p *process) current() *incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// pid returns the current incarnation's process ID, 0 if none runs.
func (p *process) pid() int {
	inc := p.current()
	if inc == nil {
		return 0
	}
	select {
	case <-inc.exited:
		return 0
	default:
		return inc.cmd.Process.Pid
	}
}

// crashed returns a channel closed when the current incarnation exits on
// its own; nil (never ready) while none runs or once the harness ended it.
func (p *process) crashed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil || p.cur.ended {
		return nil
	}
	return p.cur.exited
}

// exitError describes how the current incarnation ended on its own.
func (p *process) exitError() error {
	inc := p.current()
	<-inc.exited
	return fmt.Errorf("%s exited unexpectedly: %v (log: %s)", p.name, inc.err, p.logPath)
}

// end marks the current incarnation as ended by the harness and returns
// it, nil if none runs.
func (p *process) end() *incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil {
		p.cur.ended = true
	}
	return p.cur
}

// kill ends the current incarnation with SIGKILL and waits until it is
// gone: no deferred function, no last write, no drain.
func (p *process) kill() {
	inc := p.end()
	if inc == nil {
		return
	}
	_ = inc.cmd.Process.Kill() // fails only if it already exited
	<-inc.exited
}

// stop ends the current incarnation gracefully: SIGTERM if term, else the
// end of its stdin, which a child of RunChild takes as the same. It waits
// stopTimeout at most, then kills it. It returns an error if the child did
// not exit cleanly.
func (p *process) stop(term bool) error {
	inc := p.end()
	if inc == nil {
		return nil
	}
	if term {
		if err := inc.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("stop %s: %w", p.name, err)
		}
	} else {
		inc.stdin.Close()
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-inc.exited:
	case <-t.C:
		_ = inc.cmd.Process.Kill()
		<-inc.exited
		return fmt.Errorf("stop %s: still running %v after it was asked to stop, killed (log: %s)", p.name, stopTimeout, p.logPath)
	}
	if inc.err != nil {
		return fmt.Errorf("stop %s: %w (log: %s)", p.name, inc.err, p.logPath)
	}
	return nil
}
