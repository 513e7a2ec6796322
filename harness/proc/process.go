package proc

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

// DefaultStopTimeout bounds a graceful stop when Options.StopTimeout is 0:
// a bridge's drain (publish.DefaultDrainTimeout, 10 s) and some.
const DefaultStopTimeout = 30 * time.Second

// RequestTimeout bounds one answer of a child to a Request.
const RequestTimeout = 10 * time.Second

// linesBuffered is how many lines of a child's stdout wait for their
// reader: a child of the protocol writes one line per request and "ready"
// once; a child that streams records has a reader that keeps up.
const linesBuffered = 16

// maxLine is the longest line of a child's stdout: a fleet's bridge group
// answers with the histograms of all its bridges in one line.
const maxLine = 16 << 20

// ErrExited is what Next returns, wrapped with the child's exit status,
// once the child's stdout has ended and it exited.
var ErrExited = errors.New("exited")

// StopBy is how Stop asks a child to end.
type StopBy int

const (
	// Term sends SIGTERM, as Kubernetes stops a pod (and SIGCONT, in case
	// the child is paused).
	Term StopBy = iota
	// CloseStdin closes the child's stdin, which a child of the protocol
	// takes as the end.
	CloseStdin
)

// Options says how a Process runs its command.
type Options struct {
	// Env is the child's whole environment; nil means this process's.
	Env []string
	// Dir is the child's working directory; empty means this process's.
	Dir string
	// LogPath names a file each incarnation appends its stderr to, and its
	// stdout unless Lines; errors name it.
	LogPath string
	// Stderr receives the child's stderr, and its stdout unless Lines,
	// when LogPath is empty; nil discards them.
	Stderr io.Writer
	// Lines has the child's stdout read line by line, for Next, StartReady
	// and Request.
	Lines bool
	// StopTimeout bounds Stop's wait before it kills; 0 means
	// DefaultStopTimeout.
	StopTimeout time.Duration
}

// Process is a child process that a harness starts, stops, kills and
// starts again, each time a new incarnation with the same command and
// Options. Its methods are safe for concurrent use; requests are
// serialized.
type Process struct {
	name    string
	command []string
	opts    Options

	startMu sync.Mutex // held during Start, so that one incarnation runs at a time
	reqMu   sync.Mutex // held during a request, so that answers match requests

	mu  sync.Mutex
	cur *incarnation // the last one started; guarded by mu
}

// incarnation is one run of a child process.
type incarnation struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	// lines are the child's stdout, line by line, closed at its end; nil
	// without Options.Lines.
	lines chan string
	// abandoned is closed once the harness ended the incarnation: lines
	// that find no room in lines then are dropped, so that the reader
	// never waits for a caller that will not come.
	abandoned chan struct{}
	exited    chan struct{} // closed once Wait returned
	err       error         // Wait's result, set before exited is closed
	ended     bool          // the harness killed or stopped it; guarded by Process.mu
	ready     bool          // it wrote "ready"; guarded by Process.mu
}

// New describes a child process named name that runs command (the program
// and its arguments) as opts say. It does not start it.
func New(name string, command []string, opts Options) *Process {
	if opts.StopTimeout == 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	return &Process{name: name, command: command, opts: opts}
}

// Name returns the process's name.
func (p *Process) Name() string { return p.name }

// LogPath returns the file its output goes to, empty if none.
func (p *Process) LogPath() string { return p.opts.LogPath }

// logNote is what errors add to point at the log.
func (p *Process) logNote() string {
	if p.opts.LogPath == "" {
		return ""
	}
	return " (log: " + p.opts.LogPath + ")"
}

// Start starts a new incarnation and returns once it runs; it does not
// wait for the child to be ready. It fails if an incarnation still runs.
func (p *Process) Start() error {
	if len(p.command) == 0 {
		return fmt.Errorf("start %s: no command", p.name)
	}
	p.startMu.Lock()
	defer p.startMu.Unlock()
	if inc := p.current(); inc != nil && !isClosed(inc.exited) {
		return fmt.Errorf("start %s: it runs already (pid %d)", p.name, inc.cmd.Process.Pid)
	}
	var opened []io.Closer
	closeAll := func() {
		for _, c := range opened {
			c.Close()
		}
	}
	out := p.opts.Stderr
	var log *os.File
	if p.opts.LogPath != "" {
		var err error
		if log, err = os.OpenFile(p.opts.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return fmt.Errorf("open the log of %s: %w", p.name, err)
		}
		opened = append(opened, log)
		out = log
	}
	cmd := exec.Command(p.command[0], p.command[1:]...)
	cmd.Env = p.opts.Env
	cmd.Dir = p.opts.Dir
	cmd.SysProcAttr = sysProcAttr()
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		closeAll()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	// The stdout pipe is this package's own rather than StdoutPipe's:
	// Wait closes that one as soon as the child exits, dropping what the
	// child wrote last and nobody read yet.
	var stdoutR, stdoutW *os.File
	if p.opts.Lines {
		if stdoutR, stdoutW, err = os.Pipe(); err != nil {
			closeAll()
			return fmt.Errorf("start %s: %w", p.name, err)
		}
		opened = append(opened, stdoutR, stdoutW)
		cmd.Stdout = stdoutW
	}
	if err := cmd.Start(); err != nil {
		closeAll()
		stdin.Close()
		return fmt.Errorf("start %s (%s): %w", p.name, p.command[0], err)
	}
	inc := &incarnation{cmd: cmd, stdin: stdin, abandoned: make(chan struct{}), exited: make(chan struct{})}
	if stdoutW != nil {
		stdoutW.Close() // the child has its own copy
		inc.lines = make(chan string, linesBuffered)
		// Ends at the end of the child's stdout, which comes with its
		// exit (or Kill's, for the whole group).
		go inc.read(stdoutR)
	}
	// Ends with the process; Kill and Stop wait for it.
	go func() {
		inc.err = cmd.Wait()
		if log != nil {
			log.Close()
		}
		close(inc.exited)
	}()
	p.mu.Lock()
	p.cur = inc
	p.mu.Unlock()
	return nil
}

// read passes the lines of r to inc.lines until r ends, then closes both.
func (inc *incarnation) read(r *os.File) {
	defer r.Close()
	defer close(inc.lines)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	for sc.Scan() {
		line := sc.Text()
		select {
		case inc.lines <- line:
			continue
		default:
		}
		select {
		case inc.lines <- line:
		case <-inc.abandoned:
			_, _ = io.Copy(io.Discard, r)
			return
		}
	}
}

// StartReady starts a new incarnation of a child of the protocol and waits
// until it writes the line "ready", for timeout at most. It never leaves a
// process behind on error.
func (p *Process) StartReady(ctx context.Context, timeout time.Duration) error {
	if !p.opts.Lines {
		return fmt.Errorf("start %s: its stdout is not read (Options.Lines)", p.name)
	}
	if err := p.Start(); err != nil {
		return err
	}
	inc := p.current()
	line, err := p.next(ctx, inc, timeout)
	if err == nil && line != "ready" {
		err = fmt.Errorf("%s wrote %q first, want \"ready\"%s", p.name, line, p.logNote())
	}
	if err != nil {
		p.Kill()
		return fmt.Errorf("wait for %s to be ready: %w", p.name, err)
	}
	p.mu.Lock()
	inc.ready = true
	p.mu.Unlock()
	return nil
}

// Next returns the next line of the current incarnation's stdout, waiting
// timeout at most (0: no limit) or until ctx is done. Once the stdout has
// ended and the child exited, it returns an error that wraps ErrExited
// and says how the child ended.
func (p *Process) Next(ctx context.Context, timeout time.Duration) (string, error) {
	inc := p.current()
	if inc == nil || inc.lines == nil {
		return "", fmt.Errorf("read %s: it never started, or its stdout is not read (Options.Lines)", p.name)
	}
	return p.next(ctx, inc, timeout)
}

func (p *Process) next(ctx context.Context, inc *incarnation, timeout time.Duration) (string, error) {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case line, ok := <-inc.lines:
		if !ok {
			<-inc.exited
			return "", fmt.Errorf("%s %w: %s%s", p.name, ErrExited, status(inc.err), p.logNote())
		}
		return line, nil
	case <-expired:
		return "", fmt.Errorf("%s: no answer within %v%s", p.name, timeout, p.logNote())
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Send writes line, and a newline, to the current incarnation's stdin.
func (p *Process) Send(line string) error {
	inc := p.current()
	if inc == nil || isClosed(inc.exited) {
		return fmt.Errorf("write to %s: it is not running", p.name)
	}
	if _, err := io.WriteString(inc.stdin, line+"\n"); err != nil {
		return fmt.Errorf("write to %s: %w", p.name, err)
	}
	return nil
}

// Request writes req as a line to the current incarnation's stdin and
// decodes its answer, the next line of its stdout, into out; it waits
// RequestTimeout at most. It fails at once if no incarnation runs or the
// one that runs is not ready yet: until then its stdout is StartReady's.
func (p *Process) Request(ctx context.Context, req string, out any) error {
	p.reqMu.Lock()
	defer p.reqMu.Unlock()
	p.mu.Lock()
	inc := p.cur
	ready := inc != nil && inc.ready
	p.mu.Unlock()
	if !ready || isClosed(inc.exited) {
		return fmt.Errorf("%s is not running", p.name)
	}
	if _, err := io.WriteString(inc.stdin, req+"\n"); err != nil {
		return fmt.Errorf("ask %s: %w", p.name, err)
	}
	line, err := p.next(ctx, inc, RequestTimeout)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(line), out); err != nil {
		return fmt.Errorf("read the answer of %s: %w", p.name, err)
	}
	return nil
}

func (p *Process) current() *incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// PID returns the current incarnation's process ID, 0 if none runs.
func (p *Process) PID() int {
	inc := p.current()
	if inc == nil || isClosed(inc.exited) {
		return 0
	}
	return inc.cmd.Process.Pid
}

// Done returns a channel closed once the current incarnation has exited;
// nil (never closed) before the first Start.
func (p *Process) Done() <-chan struct{} {
	inc := p.current()
	if inc == nil {
		return nil
	}
	return inc.exited
}

// Crashed returns a channel closed when the current incarnation exits on
// its own; nil (never closed) while none runs or once the harness ended
// it with Kill or Stop.
func (p *Process) Crashed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil || p.cur.ended {
		return nil
	}
	return p.cur.exited
}

// ExitError waits until the current incarnation has exited and says how
// it ended on its own; nil if the harness ended it, or none ever ran.
func (p *Process) ExitError() error {
	p.mu.Lock()
	inc := p.cur
	ended := inc == nil || inc.ended
	p.mu.Unlock()
	if ended {
		return nil
	}
	<-inc.exited
	return fmt.Errorf("%s exited unexpectedly: %s%s", p.name, status(inc.err), p.logNote())
}

// Wait waits until the current incarnation has exited and returns its
// state and what exec.Cmd.Wait returned. It blocks until then: call it
// after Stop or Kill, or once Done is closed.
func (p *Process) Wait() (*os.ProcessState, error) {
	inc := p.current()
	if inc == nil {
		return nil, fmt.Errorf("wait for %s: it never started", p.name)
	}
	<-inc.exited
	return inc.cmd.ProcessState, inc.err
}

// end marks the current incarnation as ended by the harness and returns
// it, nil if none ever ran.
func (p *Process) end() *incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil && !p.cur.ended {
		p.cur.ended = true
		close(p.cur.abandoned)
	}
	return p.cur
}

// Kill ends the current incarnation with SIGKILL, its process group with
// it, and waits until it is gone: no deferred function, no last write, no
// drain. A paused child is killed too.
func (p *Process) Kill() {
	inc := p.end()
	if inc == nil {
		return
	}
	_ = inc.signal(syscall.SIGKILL) // fails only if it already exited
	<-inc.exited
}

// Stop ends the current incarnation gracefully, by SIGTERM or the end of
// its stdin as by says, and waits for it to exit, for Options.StopTimeout
// at most; then it kills it. It returns an error if the child did not
// exit by itself with status 0. It does nothing if none ever ran, and
// reports how the last one ended if it is no longer running.
func (p *Process) Stop(by StopBy) error {
	inc := p.end()
	if inc == nil {
		return nil
	}
	if by == Term {
		if err := inc.signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("stop %s: %w", p.name, err)
		}
		_ = inc.signal(syscall.SIGCONT) // a paused child takes SIGTERM only once continued
	} else {
		inc.stdin.Close()
	}
	t := time.NewTimer(p.opts.StopTimeout)
	defer t.Stop()
	select {
	case <-inc.exited:
	case <-t.C:
		_ = inc.signal(syscall.SIGKILL)
		<-inc.exited
		return fmt.Errorf("stop %s: still running %v after it was asked to stop, killed%s", p.name, p.opts.StopTimeout, p.logNote())
	}
	if inc.err != nil {
		return fmt.Errorf("stop %s: %w%s", p.name, inc.err, p.logNote())
	}
	return nil
}

// Pause stops the current incarnation with SIGSTOP, as a stalled machine
// or a process the scheduler does not run: it runs no code and writes
// nothing until Resume, while its sockets stay open. Kill ends a paused
// child; Stop with Term continues it first.
func (p *Process) Pause() error { return p.signal(syscall.SIGSTOP, "pause") }

// Resume continues a paused incarnation with SIGCONT.
func (p *Process) Resume() error { return p.signal(syscall.SIGCONT, "resume") }

func (p *Process) signal(sig syscall.Signal, what string) error {
	inc := p.current()
	if inc == nil {
		return fmt.Errorf("%s %s: it never started", what, p.name)
	}
	if err := inc.signal(sig); err != nil {
		return fmt.Errorf("%s %s (pid %d): %w", what, p.name, inc.cmd.Process.Pid, err)
	}
	return nil
}

// signal sends sig to the incarnation's process group; os.ErrProcessDone
// once it exited.
func (inc *incarnation) signal(sig syscall.Signal) error {
	if isClosed(inc.exited) {
		return os.ErrProcessDone
	}
	return signalGroup(inc.cmd.Process.Pid, sig)
}

// status says how a child ended from what Wait returned.
func status(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
