package main

import (
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/mattn/go-isatty"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

// ANSI escapes of the highlighted lines: bold red, then back to normal.
const (
	colorAlarm = "\x1b[1;31m"
	colorReset = "\x1b[0m"
)

// printer writes events to w, one per line: the CloudEvent JSON with json,
// else consumer.Format, after the date with date, in colour with color.
type printer struct {
	w     io.Writer
	json  bool
	date  bool
	color bool
}

// outputError is a failed write of an event to stdout.
type outputError struct{ err error }

func (e *outputError) Error() string { return "write to stdout: " + e.err.Error() }
func (e *outputError) Unwrap() error { return e.err }

// print writes e. Its error is an *outputError.
func (p printer) print(e consumer.Event) error {
	var line []byte
	if p.json {
		b, err := e.CloudEventJSON()
		if err != nil {
			return err
		}
		line = append(b, '\n')
	} else {
		s := consumer.Format(e)
		if p.date {
			s = e.Time.Format("2006-01-02 ") + s
		}
		if p.color && alarming(e) {
			s = colorAlarm + s + colorReset
		}
		line = []byte(s + "\n")
	}
	if _, err := p.w.Write(line); err != nil {
		return &outputError{err: err}
	}
	return nil
}

// alarming reports whether e is what a reader looking for trouble wants to
// see: a container that died with a non-zero exit code, or was OOMKilled.
func alarming(e consumer.Event) bool {
	if e.LifecycleType() != "ContainerDied" {
		return false
	}
	code, _ := e.ExitCode()
	return code != 0 || e.Data.Reason == "OOMKilled"
}

// useColor decides --color: always, never, or auto: only when w is a
// terminal, NO_COLOR is unset or empty (no-color.org) and TERM is not dumb.
// A command-line always overrides NO_COLOR.
func useColor(mode string, w io.Writer, getenv func(string) string) (bool, error) {
	switch mode {
	case "always":
		return true, nil
	case "never":
		return false, nil
	case "auto":
		if getenv("NO_COLOR") != "" || getenv("TERM") == "dumb" {
			return false, nil
		}
		f, ok := w.(interface{ Fd() uintptr })
		return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())), nil
	}
	return false, fmt.Errorf("--color %q: want auto, always or never", mode)
}

// endOfOutput maps err to nil if it says that stdout was closed by its
// reader (pleg-bridge tail | head): the command has done what was wanted.
func endOfOutput(err error) error {
	var oe *outputError
	if errors.As(err, &oe) && errors.Is(err, syscall.EPIPE) {
		return nil
	}
	return err
}
