package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"strconv"
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
	// Version is the pleg-bridge version recorded in the stream's metadata
	// beside schemas.ContractVersion (see EnsureStream); empty means the
	// main module's version in the build info, or "dev".
	Version string
	// Logger receives an Info record when EnsureStream changes an existing
	// stream's max age, duplicate window or metadata, and a Warn record
	// when it cannot record its contract version there; nil logs nothing.
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
//
// The stream's metadata records the contract version
// (schemas.MetadataContractVersion) and the pleg-bridge version
// (schemas.MetadataVersion) of the bridge that created it or last
// changed its configuration; see ensureLimitsStream for when that is.
func EnsureStream(ctx context.Context, js jetstream.JetStream, opts StreamOptions) (jetstream.Stream, error) {
	if err := schemas.ValidatePrefix(opts.SubjectPrefix); err != nil {
		return nil, fmt.Errorf("ensure stream: subject prefix %q: %w", opts.SubjectPrefix, err)
	}
	if opts.Name == "" {
		opts.Name = schemas.DefaultStream
	}
	want := opts.SubjectPrefix + ".>"
	cfg, err := limitsConfig("stream", opts.Name, opts.Replicas, opts.MaxAge, opts.DuplicateWindow, opts.Version)
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
// means 1), max age (0 means forever), duplicate window (0 means
// DefaultDuplicateWindow, and never longer than the max age, which
// JetStream refuses), and the metadata of a bridge of version (see
// ContractMetadata). A negative value is an error naming it.
func limitsConfig(what, name string, replicas int, maxAge, duplicates time.Duration, version string) (jetstream.StreamConfig, error) {
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
		Metadata:   ContractMetadata(version),
	}, nil
}

// metadataUpdateTimeout bounds an update of an existing stream made only
// to record the contract version: a bridge without the right to update
// the stream gets no answer (the server refuses the request, nats.go
// reports that asynchronously), and must not wait for its whole call
// timeout before it goes on without the metadata.
const metadataUpdateTimeout = 2 * time.Second

// ensureLimitsStream returns the stream want describes (what names its
// kind in messages: "stream", "archive"), creating it if it is missing.
// An existing one must pass check; its max age and duplicate window are
// then set to want's if they differ, logged on logger (if not nil), and
// nothing else of it is changed but its metadata. Of bridges that create
// it at once, one creates it and the others find it.
//
// want.Metadata is this bridge's (ContractMetadata). A stream created by
// this bridge gets it; an existing one gets it, beside its other keys,
// when its configuration is updated for its limits, and otherwise only
// when it records no contract version or an older one than this bridge's:
// once per contract change, not once per start, so that bridges of one
// contract but different versions in a rollout do not update it in turn.
// A stream of a newer contract keeps its metadata and is warned of (a
// downgrade). An update made only for the metadata that fails (no right
// to update the stream, say) is logged and the stream returned.
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
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}

	cfg := stream.CachedInfo().Config
	if err := check(cfg); err != nil {
		return nil, err
	}
	limits := cfg.MaxAge != want.MaxAge || cfg.Duplicates != want.Duplicates
	recorded := cfg.Metadata[schemas.MetadataContractVersion]
	order := compareContract(recorded, want.Metadata[schemas.MetadataContractVersion])
	if order > 0 {
		logger.Warn("the "+what+" was set up by a bridge of a newer contract version; this bridge publishes its own",
			"stream", want.Name, "contract_version", want.Metadata[schemas.MetadataContractVersion],
			"stream_contract_version", recorded, "stream_version", cfg.Metadata[schemas.MetadataVersion])
	}
	if !limits && order >= 0 {
		return stream, nil
	}
	updated := cfg
	if order <= 0 {
		updated.Metadata = maps.Clone(cfg.Metadata)
		if updated.Metadata == nil {
			updated.Metadata = map[string]string{}
		}
		maps.Copy(updated.Metadata, want.Metadata)
	}
	if !limits {
		uctx, cancel := context.WithTimeout(ctx, metadataUpdateTimeout)
		defer cancel()
		if s, err := js.UpdateStream(uctx, updated); err != nil {
			logger.Warn("cannot record the contract version in the "+what+"'s metadata; going on without",
				"stream", want.Name, "contract_version", want.Metadata[schemas.MetadataContractVersion], "err", err)
		} else {
			stream = s
			logger.Info("recorded the contract version in the "+what+"'s metadata", "stream", want.Name,
				"old_contract_version", recorded, "contract_version", want.Metadata[schemas.MetadataContractVersion],
				"version", want.Metadata[schemas.MetadataVersion])
		}
		return stream, nil
	}
	updated.MaxAge = want.MaxAge
	updated.Duplicates = want.Duplicates
	stream, err = js.UpdateStream(ctx, updated)
	if err != nil {
		return nil, fmt.Errorf("update %s %s: %w", what, want.Name, err)
	}
	logger.Info("updated "+what,
		"stream", want.Name,
		"old_max_age", cfg.MaxAge, "max_age", want.MaxAge,
		"old_duplicate_window", cfg.Duplicates, "duplicate_window", want.Duplicates,
		"contract_version", updated.Metadata[schemas.MetadataContractVersion], "version", updated.Metadata[schemas.MetadataVersion])
	return stream, nil
}

// ContractMetadata returns the metadata a bridge of version records on the
// stream, the archive and the state bucket (statebucket.Ensure) it sets
// up: the contract version and its pleg-bridge version (empty:
// BuildVersion).
func ContractMetadata(version string) map[string]string {
	return map[string]string{
		schemas.MetadataContractVersion: schemas.ContractVersion,
		schemas.MetadataVersion:         cmp.Or(version, BuildVersion()),
	}
}

// BuildVersion is the main module's version in the build info (what `go
// build` in a VCS checkout and `go install` stamp), or "dev": the version
// a bridge records where none is given, and the command's own where the
// linker stamped none.
func BuildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// compareContract compares two contract versions as numbers: -1 when a
// is older than b, 0 when they are equal, +1 when a is newer. A version
// that is missing or not a number is older than any.
func compareContract(a, b string) int {
	x, errA := strconv.ParseUint(a, 10, 32)
	y, errB := strconv.ParseUint(b, 10, 32)
	switch {
	case errA != nil && errB != nil:
		return 0
	case errA != nil:
		return -1
	case errB != nil:
		return 1
	}
	return cmp.Compare(x, y)
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
