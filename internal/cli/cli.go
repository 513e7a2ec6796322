package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
)

// ErrUsage is returned when a command runs without a subcommand, once its
// usage is printed on stderr.
var ErrUsage = errors.New("usage")

// UsageError is a mistake in the command line: an unknown command or flag,
// a flag value that does not parse or does not make sense, a stray
// argument. Report prints it once, with a pointer to the command's --help,
// and the exit status is 2.
type UsageError struct {
	Cmd string // the command path, "pleg-bridge tail"
	Err error
}

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// UsageErrorf returns a *UsageError of cmd with a formatted message.
func UsageErrorf(cmd, format string, args ...any) error {
	return &UsageError{Cmd: cmd, Err: fmt.Errorf(format, args...)}
}

// Report prints what the user needs to know about err on stderr, once,
// prefixed with the program's name, and returns the exit status: 0 for
// success or help, 2 for a usage error, 1 for anything else.
func Report(err error, program string, stderr io.Writer) int {
	var ue *UsageError
	var es ExitStatus
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &es):
		return int(es)
	case errors.Is(err, ErrUsage):
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", ue.Cmd, ue.Err, ue.Cmd)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", program, err)
	return 1
}

// ExitStatus is the exit status of a program run on the command's behalf
// (pleg-bridge soak runs pleg-harness soak), which has said on its own
// stderr what went wrong: Report returns it and prints nothing more.
type ExitStatus int

func (e ExitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Configure sets on root what every command tree here shares: errors are
// returned, not printed (Report prints them once), a failure does not
// print the usage, a flag that does not parse is a *UsageError, and there
// is no default completion command.
func Configure(root *cobra.Command, stdout, stderr io.Writer) {
	root.SilenceErrors = true
	root.SilenceUsage = true
	root.CompletionOptions = cobra.CompletionOptions{DisableDefaultCmd: true}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &UsageError{Cmd: c.CommandPath(), Err: err}
	})
}

// Execute runs root with args until ctx is done. An error of cobra's own
// about the command line (an unknown command) becomes a *UsageError.
func Execute(ctx context.Context, root *cobra.Command, args []string) error {
	if args == nil {
		args = []string{} // cobra reads os.Args when args is nil
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	var ue *UsageError
	if err != nil && cmd == root && !errors.Is(err, ErrUsage) && !errors.As(err, &ue) {
		return &UsageError{Cmd: root.Name(), Err: err}
	}
	return err
}

// NoArgs refuses positional arguments, as a usage error.
func NoArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return UsageErrorf(c.CommandPath(), "unexpected argument %q", args[0])
	}
	return nil
}

// LogFormat is how a process logs: PLEG_LOG_FORMAT.
type LogFormat string

// Log formats.
const (
	// LogAuto is tint with colour on a terminal, JSON otherwise.
	LogAuto LogFormat = "auto"
	LogText LogFormat = "text"
	LogJSON LogFormat = "json"
)

// NewLogger builds the one logger of a process: tint with colour on a
// terminal, JSON (with the standard level and msg keys) for machines.
func NewLogger(w io.Writer, format LogFormat, level slog.Level) *slog.Logger {
	terminal := false
	if f, ok := w.(*os.File); ok {
		terminal = isatty.IsTerminal(f.Fd())
	}
	switch {
	case format == LogJSON || (format == LogAuto && !terminal):
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durationsAsText}))
	default:
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly + ".000", NoColor: !terminal}))
	}
}

// durationsAsText writes durations as "1.5s" rather than nanoseconds, for
// the people who read JSON logs too.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
