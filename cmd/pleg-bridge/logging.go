package main

import (
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"
)

// newLogger builds the one logger of the process: tint with colour on a
// terminal, JSON (with the standard level and msg keys) for machines.
func newLogger(w io.Writer, format logFormat, level slog.Level) *slog.Logger {
	terminal := false
	if f, ok := w.(*os.File); ok {
		terminal = isatty.IsTerminal(f.Fd())
	}
	switch {
	case format == logJSON || (format == logAuto && !terminal):
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durationsAsText}))
	default:
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly + ".000", NoColor: !terminal}))
	}
}

// durationsAsText writes durations as "1.5s" rather than nanoseconds, for the
// people who read JSON logs too.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
