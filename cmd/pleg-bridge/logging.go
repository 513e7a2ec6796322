package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"
)

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(strings.ToUpper(s)))
	return l, err
}

// newLogger builds the one logger of the process: tint with colour on a
// terminal, JSON (with the standard level and msg keys) for machines.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	lvl, err := parseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("PLEG_LOG_LEVEL=%q: %w", level, err)
	}
	terminal := false
	if f, ok := w.(*os.File); ok {
		terminal = isatty.IsTerminal(f.Fd())
	}
	switch {
	case format == "json" || (format == "auto" && !terminal):
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationsAsText})), nil
	default:
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: lvl, TimeFormat: time.TimeOnly + ".000", NoColor: !terminal})), nil
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
