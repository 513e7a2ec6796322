package soak

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// This file holds what a run's schedule needs besides its faults, shared
// by the soak and the fleet harness (package fleet): the progress lines
// and problems it reports, and the waits that end early when the run
// cannot go on.

// Progress prints a run's progress, one line per phase with the time since
// the churn started and the transitions made so far, and keeps the
// problems found outside the accounting. It is not safe for concurrent
// use.
type Progress struct {
	out      io.Writer
	logger   *slog.Logger
	kind     string // names the run in the log: "<kind> problem"
	start    time.Time
	count    func() int
	problems []string
}

// NewProgress returns a Progress that prints to out and logs each problem
// to logger at Warn, as a "<kind> problem".
func NewProgress(out io.Writer, logger *slog.Logger, kind string) *Progress {
	return &Progress{out: out, logger: logger, kind: kind}
}

// Started says that the churn started at start and that count returns the
// transitions made so far: the lines after it carry both.
func (p *Progress) Started(start time.Time, count func() int) {
	p.start, p.count = start, count
}

// Printf prints one line of progress.
func (p *Progress) Printf(format string, args ...any) {
	at := "      -"
	if !p.start.IsZero() {
		at = fmt.Sprintf("%6.1fs", time.Since(p.start).Seconds())
	}
	line := fmt.Sprintf(format, args...)
	if p.count != nil {
		line += fmt.Sprintf(" [%d transitions so far]", p.count())
	}
	fmt.Fprintf(p.out, "%s  %s\n", at, line)
}

// Problem logs a problem and keeps it for the report.
func (p *Progress) Problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.logger.Warn(p.kind+" problem", "problem", msg)
	p.problems = append(p.problems, msg)
}

// Problems returns the problems kept so far.
func (p *Progress) Problems() []string { return p.problems }

// Watch is what a run's waits end early on, besides their ctx: a process
// the run needs that exited on its own, and the churn's end.
type Watch struct {
	// Crashed is closed once such a process exited, and CrashErr then says
	// how; a nil channel is never closed.
	Crashed  <-chan struct{}
	CrashErr func() error
	// Churn receives the churn's result: an error, or nil if it stopped,
	// which is early too.
	Churn <-chan error
}

// Until waits until t; see For.
func (w Watch) Until(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	return await(ctx, w, timer.C)
}

// For waits until done is closed. It returns early with ctx.Err() if ctx
// ends, with CrashErr() once Crashed is closed, and with the churn's error
// ("churn stopped early" if it has none) if the churn ends.
func (w Watch) For(ctx context.Context, done <-chan struct{}) error {
	return await(ctx, w, done)
}

func await[T any](ctx context.Context, w Watch, done <-chan T) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.Crashed:
		return w.CrashErr()
	case err := <-w.Churn:
		if err == nil {
			err = fmt.Errorf("churn stopped early")
		}
		return err
	}
}
