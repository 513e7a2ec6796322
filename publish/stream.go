package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// DefaultDuplicateWindow is the stream's duplicate window when none is
// configured: JetStream's own default, which the README documents for
// PLEG_STREAM_DUPLICATE_WINDOW.
const DefaultDuplicateWindow = 2 * time.Minute

// StreamOptions describes the stream EnsureStream provisions.
type StreamOptions struct {
	// Name is the stream name; empty means schemas.DefaultStream.
	Name string
	// SubjectPrefix is the subject prefix; the stream takes <prefix>.>.
	SubjectPrefix string
	// Replicas is the number of replicas; 0 means 1.
	Replicas int
	// MaxAge is how long messages are kept; 0 means forever.
	MaxAge time.Duration
	// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id; 0 means
	// DefaultDuplicateWindow.
	DuplicateWindow time.Duration
	// Logger receives an Info record when EnsureStream changes an existing
	// stream's max age or duplicate window; nil logs nothing.
	Logger *slog.Logger
}

// EnsureStream returns the stream opts.Name, creating it if it is missing:
// subjects <prefix>.>, file storage, limits retention, with the max age,
// duplicate window and replicas of opts.
//
// An existing stream is not rewritten: if none of its subjects covers
// <prefix>.>, EnsureStream returns an error naming the stream and its
// subjects. Only its max age and duplicate window are updated when they
// differ from opts (and logged to opts.Logger); storage, retention and
// replicas are left as the operator set them.
func EnsureStream(ctx context.Context, js jetstream.JetStream, opts StreamOptions) (jetstream.Stream, error) {
	if err := schemas.ValidatePrefix(opts.SubjectPrefix); err != nil {
		return nil, fmt.Errorf("ensure stream: subject prefix %q: %w", opts.SubjectPrefix, err)
	}
	if opts.Name == "" {
		opts.Name = schemas.DefaultStream
	}
	want := opts.SubjectPrefix + ".>"
	cfg, err := limitsConfig("stream", opts.Name, opts.Replicas, opts.MaxAge, opts.DuplicateWindow)
	if err != nil {
		return nil, err
	}
	cfg.Subjects = []string{want}
	return ensureLimitsStream(ctx, js, "stream", cfg, func(cfg jetstream.StreamConfig) error {
		if !anyCovers(cfg.Subjects, want) {
			return fmt.Errorf("ensure stream %s: its subjects [%s] do not cover %s; add %s to the stream or use another stream name",
				opts.Name, strings.Join(cfg.Subjects, " "), want, want)
		}
		return nil
	}, opts.Logger)
}

// limitsConfig returns the configuration both kinds of stream share (what
// names the kind in errors): file storage, limits retention, replicas (0
// means 1), max age (0 means forever) and duplicate window (0 means
// DefaultDuplicateWindow, and never longer than the max age, which
// JetStream refuses). A negative value is an error naming it.
func limitsConfig(what, name string, replicas int, maxAge, duplicates time.Duration) (jetstream.StreamConfig, error) {
	switch {
	case replicas < 0:
		return jetstream.StreamConfig{}, fmt.Errorf("ensure %s %s: replicas %d is negative", what, name, replicas)
	case maxAge < 0:
		return jetstream.StreamConfig{}, fmt.Errorf("ensure %s %s: max age %s is negative", what, name, maxAge)
	case duplicates < 0:
		return jetstream.StreamConfig{}, fmt.Errorf("ensure %s %s: duplicate window %s is negative", what, name, duplicates)
	}
	duplicates = cmp.Or(duplicates, DefaultDuplicateWindow)
	if maxAge > 0 && duplicates > maxAge {
		duplicates = maxAge
	}
	return jetstream.StreamConfig{
		Name:       name,
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     maxAge,
		Duplicates: duplicates,
		Replicas:   cmp.Or(replicas, 1),
	}, nil
}

// ensureLimitsStream returns the stream want describes (what names its
// kind in messages: "stream", "archive"), creating it if it is missing.
// An existing one must pass check; its max age and duplicate window are
// then set to want's if they differ, logged on logger (if not nil), and
// nothing else of it is changed. Of bridges that create it at once, one
// creates it and the others find it.
func ensureLimitsStream(ctx context.Context, js jetstream.JetStream, what string, want jetstream.StreamConfig, check func(jetstream.StreamConfig) error, logger *slog.Logger) (jetstream.Stream, error) {
	stream, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		stream, err = js.CreateStream(ctx, want)
		if err == nil {
			return stream, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("create %s %s: %w", what, want.Name, err)
		}
		// Another bridge created it between our lookup and create.
		stream, err = js.Stream(ctx, want.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("look up %s %s: %w", what, want.Name, err)
	}

	cfg := stream.CachedInfo().Config
	if err := check(cfg); err != nil {
		return nil, err
	}
	if cfg.MaxAge == want.MaxAge && cfg.Duplicates == want.Duplicates {
		return stream, nil
	}
	updated := cfg
	updated.MaxAge = want.MaxAge
	updated.Duplicates = want.Duplicates
	stream, err = js.UpdateStream(ctx, updated)
	if err != nil {
		return nil, fmt.Errorf("update %s %s: %w", what, want.Name, err)
	}
	if logger != nil {
		logger.Info("updated "+what,
			"stream", want.Name,
			"old_max_age", cfg.MaxAge, "max_age", want.MaxAge,
			"old_duplicate_window", cfg.Duplicates, "duplicate_window", want.Duplicates)
	}
	return stream, nil
}

func anyCovers(filters []string, subject string) bool {
	for _, f := range filters {
		if subjectCovers(f, subject) {
			return true
		}
	}
	return false
}

// subjectCovers reports whether every subject matched by the wildcard
// subject sub (whose wildcards are read as wildcards) is also matched by
// filter.
func subjectCovers(filter, sub string) bool {
	ft := strings.Split(filter, ".")
	st := strings.Split(sub, ".")
	for i, f := range ft {
		if f == ">" {
			// Matches one or more remaining tokens: sub must have at least one.
			return i < len(st)
		}
		if i >= len(st) {
			return false
		}
		s := st[i]
		switch {
		case s == ">":
			// sub goes on with any number of tokens; only ">" covers that.
			return false
		case f == "*":
			// Covers any single token, "*" included.
		case f != s:
			return false
		}
	}
	return len(ft) == len(st)
}
