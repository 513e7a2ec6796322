package proc_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// childEnv makes the test binary a child of the tests below, in the role
// it names.
const childEnv = "PROC_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

// runChild is the child: it writes "ready", then answers each line of its
// stdin with {"N": <lines so far>}, until its stdin ends (status 0) or a
// line "exit" (status 3). Role "stubborn" ignores SIGTERM; role "logger"
// writes a line to stderr first; role "late" writes "hello" first.
func runChild(role string) int {
	switch role {
	case "stubborn":
		signal.Ignore(syscall.SIGTERM)
	case "logger":
		fmt.Fprintln(os.Stderr, "child log line")
	case "late":
		fmt.Println("hello")
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for n := 1; in.Scan(); n++ {
		if in.Text() == "exit" {
			return 3
		}
		fmt.Printf("{\"N\": %d}\n", n)
	}
	if role == "stubborn" {
		select {} // only SIGKILL ends it
	}
	return 0
}

func newChild(t *testing.T, role string, opts proc.Options) *proc.Process {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts.Env = append(os.Environ(), childEnv+"="+role)
	opts.Lines = true
	p := proc.New("child-"+role, []string{exe}, opts)
	t.Cleanup(p.Kill)
	return p
}

type answer struct{ N int }

func request(t *testing.T, p *proc.Process) int {
	t.Helper()
	var a answer
	if err := p.Request(t.Context(), "next", &a); err != nil {
		t.Fatal(err)
	}
	return a.N
}

func TestProcess(t *testing.T) {
	t.Parallel()
	t.Run("a child of the protocol answers requests in order once ready, and ends cleanly when its stdin closes", func(t *testing.T) {
		t.Parallel()
		p := newChild(t, "plain", proc.Options{})
		if err := p.StartReady(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		for want := 1; want <= 3; want++ {
			if got := request(t, p); got != want {
				t.Fatalf("answer %d: N = %d", want, got)
			}
		}
		if err := p.Stop(proc.CloseStdin); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if st, _ := p.Wait(); !st.Success() {
			t.Errorf("exit state %v, want success", st)
		}
		if p.PID() != 0 {
			t.Errorf("PID() = %d after the stop, want 0", p.PID())
		}
	})

	t.Run("a killed child is not a crash, and starting it again runs a new incarnation", func(t *testing.T) {
		t.Parallel()
		p := newChild(t, "plain", proc.Options{})
		if err := p.StartReady(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		first := p.PID()
		request(t, p)
		p.Kill()
		if p.Crashed() != nil {
			t.Error("Crashed() is not nil after Kill")
		}
		if err := p.ExitError(); err != nil {
			t.Errorf("ExitError() = %v after Kill, want nil", err)
		}
		if err := p.Request(t.Context(), "next", &answer{}); err == nil {
			t.Error("a request to a killed child succeeded")
		}
		if err := p.StartReady(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		if p.PID() == first || p.PID() == 0 {
			t.Errorf("PID() = %d after the restart, first incarnation's %d", p.PID(), first)
		}
		if got := request(t, p); got != 1 {
			t.Errorf("first answer of the new incarnation: N = %d, want 1", got)
		}
		if err := p.Start(); err == nil {
			t.Error("Start succeeded while an incarnation runs")
		}
	})

	t.Run("a child that exits on its own is a crash, told with its status and its log", func(t *testing.T) {
		t.Parallel()
		logPath := filepath.Join(t.TempDir(), "child.log")
		p := newChild(t, "logger", proc.Options{LogPath: logPath})
		if err := p.StartReady(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := p.Send("exit"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Crashed():
		case <-time.After(time.Minute):
			t.Fatal("Crashed() not closed a minute after the child exited")
		}
		err := p.ExitError()
		if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), logPath) {
			t.Errorf("ExitError() = %v, want its status 3 and the log %s", err, logPath)
		}
		if _, err := p.Next(t.Context(), time.Minute); !errors.Is(err, proc.ErrExited) {
			t.Errorf("Next after the exit = %v, want ErrExited", err)
		}
		log, err := os.ReadFile(logPath)
		if err != nil || !strings.Contains(string(log), "child log line") {
			t.Errorf("log %q (%v), want the child's stderr", log, err)
		}
	})

	t.Run("a child that ignores SIGTERM is killed once the stop's deadline passes, and the error says so", func(t *testing.T) {
		t.Parallel()
		p := newChild(t, "stubborn", proc.Options{StopTimeout: 500 * time.Millisecond})
		if err := p.StartReady(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		err := p.Stop(proc.Term)
		if err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("Stop = %v, want a kill after the deadline", err)
		}
		if st, _ := p.Wait(); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("exit state %v, want killed", st)
		}
	})

	t.Run("a paused child answers nothing until it is resumed", func(t *testing.T) {
		t.Parallel()
		p := newChild(t, "plain", proc.Options{})
		if err := p.StartReady(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := p.Pause(); err != nil {
			t.Fatal(err)
		}
		if err := p.Send("next"); err != nil {
			t.Fatal(err)
		}
		if line, err := p.Next(t.Context(), 300*time.Millisecond); err == nil {
			t.Fatalf("a paused child answered %q", line)
		}
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
		if line, err := p.Next(t.Context(), time.Minute); err != nil || line != `{"N": 1}` {
			t.Fatalf("after Resume: %q, %v; want the answer", line, err)
		}
		if err := p.Stop(proc.Term); err == nil || !strings.Contains(err.Error(), "terminated") {
			t.Errorf("Stop(Term) of a child that does not handle SIGTERM = %v, want its death by SIGTERM", err)
		}
	})

	t.Run("a child whose first line is not ready fails to start and is gone", func(t *testing.T) {
		t.Parallel()
		p := newChild(t, "late", proc.Options{})
		err := p.StartReady(t.Context(), time.Minute)
		if err == nil || !strings.Contains(err.Error(), `"hello"`) {
			t.Fatalf("StartReady = %v, want the line it wrote named", err)
		}
		if p.PID() != 0 {
			t.Errorf("PID() = %d after a failed start, want 0", p.PID())
		}
	})

	t.Run("a command that does not exist fails to start, named", func(t *testing.T) {
		t.Parallel()
		p := proc.New("ghost", []string{filepath.Join(t.TempDir(), "no-such-binary")}, proc.Options{})
		if err := p.Start(); err == nil || !strings.Contains(err.Error(), "no-such-binary") {
			t.Errorf("Start = %v, want the command named", err)
		}
	})
}

func TestUsage(t *testing.T) {
	t.Parallel()
	p := newChild(t, "plain", proc.Options{})
	if _, _, err := p.Usage(); err == nil {
		t.Error("Usage of a child that never started succeeded")
	}
	if err := p.StartReady(t.Context(), time.Minute); err != nil {
		t.Fatal(err)
	}
	s, pid, err := p.Usage()
	if runtime.GOOS != "linux" {
		if err == nil {
			t.Error("Usage succeeded off Linux")
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if pid != p.PID() || s.RSS <= 0 || s.PeakRSS < s.RSS {
		t.Errorf("Usage() = %+v, pid %d (child %d): want resident memory and a peak at least as high", s, pid, p.PID())
	}
}
