package soak

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// This file holds what a run's schedule needs besides its faults, shared
// by the soak and the fleet harness (package fleet): the Runner of the
// sequence both follow, the progress lines and problems it reports, and
// the waits that end early when the run cannot go on.

// Runner runs the sequence a soak and a fleet share, once their parts are
// up: it starts the churn, cuts the run into windows (the ones given
// before, a baseline, one per fault, a recovery) and injects each fault in
// its own, stops the churn, waits until the stream holds every transition
// made, has the run stop what publishes, reads the stream back and
// accounts for each transition, window by window. What differs between
// the two harnesses (their churn, their faults, what they stop) comes in
// as the functions below; Run calls them from its own goroutine, but for
// Churn, which runs beside it.
//
// The windows are of equal length as long as each fault fits its window.
// A fault that takes longer (a cluster's servers waiting for each other, a
// bridge slow to get ready, a fleet slow to drain) still gets
// QuietAfterFault after it, and the windows after it share what is left.
type Runner struct {
	// Duration is how long the churn runs, from its start, unless faults
	// take longer.
	Duration time.Duration
	// Faults are injected in this order, each in a window named for it.
	Faults []string
	// QuietAfterFault is the least time a fault's window leaves after
	// Inject returned.
	QuietAfterFault time.Duration
	// JS, Stream and SettleTimeout say where the transitions are stored
	// and how long the stream may take, once the churn stopped, to hold
	// them all.
	JS            jetstream.JetStream
	Stream        string
	SettleTimeout time.Duration
	// Progress prints the run's progress and keeps its problems.
	Progress *Progress
	// Baseline is the progress line of the baseline window.
	Baseline string
	// Before are windows before the baseline (a fleet's start-up); the
	// baseline ends the last one.
	Before []Window

	// Churn makes transitions until ctx ends; Count says how many so far,
	// and Transitions lists them once Churn returned.
	Churn       func(ctx context.Context) error
	Count       func() int
	Transitions func() []Transition
	// Crash is what the waits end early on besides the churn: a process
	// the run needs that exited on its own. Each wait asks for it anew,
	// since a process started again after a fault is another.
	Crash func() (crashed <-chan struct{}, crashErr func() error)
	// Inject makes fault happen from at, repairs it, and returns what
	// happened, for the progress line.
	Inject func(ctx context.Context, fault string, at time.Time) (string, error)
	// WindowClosed, if set, is called each time a window ends, the last
	// one once the churn stopped.
	WindowClosed func(ctx context.Context)
	// ChurnStopped, if set, is called once the churn stopped and the last
	// window closed, before the wait for the stream.
	ChurnStopped func(ctx context.Context)
	// Stop stops what publishes, once the stream holds held messages (or
	// SettleTimeout passed), so that the read-back sees all it published;
	// end is when the churn stopped.
	Stop func(ctx context.Context, end time.Time, held int)
	// Excused, if set, returns what the accounting excuses once the run is
	// over: the health probe's failures and the windows in which the
	// runtime could not be observed (see Accounting).
	Excused func() ([]HealthFailure, []Window)

	start    time.Time
	windows  []Window
	churnErr chan error // the churn's result
}

// Outcome is what a Runner's run made and found.
type Outcome struct {
	// Start is when the churn started, End when it stopped; Settle is how
	// long the stream then took to hold every transition made (or
	// SettleTimeout).
	Start, End time.Time
	Settle     time.Duration
	// Windows are the run's windows, in time order.
	Windows []Window
	// Made are the transitions the churn made, Stored the messages the
	// stream held at the end and Undecodable those that did not decode.
	Made        []Transition
	Stored      []Stored
	Undecodable []string
	Accounting  Accounting
}

// Run runs the sequence. It returns an error, and no outcome, only if the
// run could not go on: a fault could not be injected, the churn failed,
// Crash reported a process gone, ctx ended, the stream could not be read.
// The churn has stopped when it returns.
func (r *Runner) Run(ctx context.Context) (Outcome, error) {
	churnCtx, stopChurn := context.WithCancel(ctx)
	r.churnErr = make(chan error, 1) // one send: the churn never waits for a reader
	var churned sync.WaitGroup
	defer churned.Wait()
	defer stopChurn()
	r.start = time.Now()
	r.Progress.Started(r.start, r.Count)
	r.windows = slices.Clone(r.Before)
	churned.Go(func() { r.churnErr <- r.Churn(churnCtx) })

	if err := r.schedule(ctx); err != nil {
		return Outcome{}, err
	}
	stopChurn()
	if err := <-r.churnErr; err != nil {
		return Outcome{}, err
	}
	end := time.Now()
	r.closeWindow(ctx, end)
	if r.ChurnStopped != nil {
		r.ChurnStopped(ctx)
	}
	made := r.Transitions()
	r.Progress.Printf("churn stopped: %d transitions made; waiting up to %v for the stream to hold them", len(made), r.SettleTimeout)
	held, err := settle(ctx, r.JS, r.Stream, len(made), r.SettleTimeout)
	if err != nil {
		r.Progress.Problem("settle: %v", err)
	}
	settled := time.Since(end)
	r.Stop(ctx, end, held)
	stored, undecodable, err := readStream(ctx, r.JS, r.Stream)
	if err != nil {
		return Outcome{}, err
	}
	var health []HealthFailure
	var blind []Window
	if r.Excused != nil {
		health, blind = r.Excused()
	}
	return Outcome{
		Start: r.start, End: end, Settle: settled, Windows: r.windows,
		Made: made, Stored: stored, Undecodable: undecodable,
		Accounting: account(r.windows, made, stored, health, blind),
	}, nil
}

// Start returns when the churn started; zero before Run.
func (r *Runner) Start() time.Time { return r.start }

// Windows returns the windows so far, the last one open until the churn
// stopped.
func (r *Runner) Windows() []Window { return r.windows }

// schedule runs the windows from the baseline to the recovery, and
// returns when the recovery window is over.
func (r *Runner) schedule(ctx context.Context) error {
	end := r.start.Add(r.Duration)
	// windowEnd is when the window that began at from ends, with left
	// windows from it to the end, this one included, and its fault
	// repaired at repaired.
	windowEnd := func(from, repaired time.Time, left int) time.Time {
		share := from.Add(end.Sub(from) / time.Duration(left))
		return later(share, repaired.Add(r.QuietAfterFault))
	}
	n := len(r.Faults)
	r.openWindow(ctx, "baseline", r.start)
	r.Progress.Printf("%s", r.Baseline)
	if err := r.Until(ctx, windowEnd(r.start, r.start, n+2)); err != nil {
		return err
	}
	for i, fault := range r.Faults {
		at := time.Now()
		r.openWindow(ctx, fault, at)
		r.Progress.Printf("%s", fault)
		note, err := r.Inject(ctx, fault, at)
		if err != nil {
			return fmt.Errorf("inject %s: %w", fault, err)
		}
		r.Progress.Printf("%s: %s", fault, note)
		if err := r.Until(ctx, windowEnd(at, time.Now(), n-i+1)); err != nil {
			return err
		}
	}
	r.openWindow(ctx, "recovery", time.Now())
	r.Progress.Printf("recovery: no more faults")
	return r.Until(ctx, later(end, time.Now().Add(r.QuietAfterFault)))
}

// openWindow starts a window at at, ending the one before.
func (r *Runner) openWindow(ctx context.Context, name string, at time.Time) {
	r.closeWindow(ctx, at)
	r.windows = append(r.windows, Window{Name: name, From: at})
}

// closeWindow ends the last window at at, if there is one.
func (r *Runner) closeWindow(ctx context.Context, at time.Time) {
	if len(r.windows) == 0 {
		return
	}
	r.windows[len(r.windows)-1].To = at
	if r.WindowClosed != nil {
		r.WindowClosed(ctx)
	}
}

// Watch returns what a wait of the run ends early on: the process Crash
// names, and the churn.
func (r *Runner) Watch() Watch {
	w := Watch{Churn: r.churnErr}
	if r.Crash != nil {
		w.Crashed, w.CrashErr = r.Crash()
	}
	return w
}

// Until waits until t; see Watch.For.
func (r *Runner) Until(ctx context.Context, t time.Time) error {
	return r.Watch().Until(ctx, t)
}

// Wait waits for d; see Watch.For.
func (r *Runner) Wait(ctx context.Context, d time.Duration) error {
	return r.Until(ctx, time.Now().Add(d))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

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
