package publish

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// ArchiveOptions describe the archive stream EnsureArchive provisions: a
// longer-lived copy of the event stream whose subjects carry no pod UID, so
// that nats-server's per-subject memory grows with the fleet's nodes and
// namespaces, not with its pods (docs/capacity.md).
type ArchiveOptions struct {
	// Name is the archive stream's name; empty means schemas.ArchiveName(Stream).
	Name string
	// Stream is the event stream it sources; empty means
	// schemas.DefaultStream.
	Stream string
	// SubjectPrefix is the event stream's subject prefix.
	SubjectPrefix string
	// Replicas is the number of replicas of an archive EnsureArchive
	// creates; 0 means 1.
	Replicas int
	// MaxAge is how long the archive keeps events; 0 means forever.
	MaxAge time.Duration
	// DuplicateWindow is the archive's duplicate window; 0 means
	// DefaultDuplicateWindow. The source itself is exactly once (the server
	// tracks the last sourced sequence), so this only bounds the ids held.
	DuplicateWindow time.Duration
	// Version is the pleg-bridge version recorded in the archive's metadata
	// beside schemas.ContractVersion, as StreamOptions.Version.
	Version string
	// Logger receives an Info record when EnsureArchive changes an existing
	// archive's max age or metadata; nil logs nothing.
	Logger *slog.Logger
}

// ArchiveTransforms returns the subject transforms of the archive's
// source: the pod UID token of both subject layouts becomes "%" (the
// contract's encoding of the empty string, so schemas.ParseSubject reads
// an empty pod UID), and the legacy layout's missing namespace becomes "%"
// too, so that every archived subject is
// <prefix>.<node>.<namespace>.%.<eventType>, one per node, namespace and
// Lifecycle event type. The two source filters do not overlap (they differ
// in their number of tokens), which the server requires.
func ArchiveTransforms(prefix string) []jetstream.SubjectTransformConfig {
	empty := schemas.EncodeToken("")
	return []jetstream.SubjectTransformConfig{
		{Source: prefix + ".*.*.*.*", Destination: prefix + ".{{wildcard(1)}}.{{wildcard(2)}}." + empty + ".{{wildcard(4)}}"},
		{Source: prefix + ".*.*.*", Destination: prefix + ".{{wildcard(1)}}." + empty + "." + empty + ".{{wildcard(3)}}"},
	}
}

// EnsureArchive returns the archive stream opts describe, creating it if it
// is missing: no subjects of its own, one source (the event stream, through
// ArchiveTransforms, from its first message: one source keeps each pod's
// order, and an explicit start sequence keeps the server from starting at
// the event stream's last message time), file storage, limits retention,
// opts' max age and replicas.
//
// An existing archive is not rewritten: if it has no source from the event
// stream with ArchiveTransforms, EnsureArchive returns an error naming it
// (the operator may have built it otherwise; changing a source would
// restart it). Only its max age and duplicate window are updated when they
// differ from opts, and its metadata as EnsureStream's.
func EnsureArchive(ctx context.Context, js jetstream.JetStream, opts ArchiveOptions) (jetstream.Stream, error) {
	if err := schemas.ValidatePrefix(opts.SubjectPrefix); err != nil {
		return nil, fmt.Errorf("ensure archive: subject prefix %q: %w", opts.SubjectPrefix, err)
	}
	if opts.Stream == "" {
		opts.Stream = schemas.DefaultStream
	}
	if opts.Name == "" {
		opts.Name = schemas.ArchiveName(opts.Stream)
	}
	if opts.Name == opts.Stream {
		return nil, fmt.Errorf("ensure archive %s: it cannot be the event stream itself", opts.Name)
	}
	transforms := ArchiveTransforms(opts.SubjectPrefix)

	cfg, err := limitsConfig("archive", opts.Name, opts.Replicas, opts.MaxAge, opts.DuplicateWindow, opts.Version)
	if err != nil {
		return nil, err
	}
	cfg.Sources = []*jetstream.StreamSource{{
		Name:              opts.Stream,
		OptStartSeq:       1,
		SubjectTransforms: transforms,
	}}
	return ensureLimitsStream(ctx, js, "archive", cfg, func(cfg jetstream.StreamConfig) error {
		if !hasArchiveSource(cfg, opts.Stream, transforms) {
			return fmt.Errorf("ensure archive %s: it has no source from stream %s with the transforms %s → %s and %s → %s; delete it or use another archive name",
				opts.Name, opts.Stream, transforms[0].Source, transforms[0].Destination, transforms[1].Source, transforms[1].Destination)
		}
		return nil
	}, opts.Logger)
}

// hasArchiveSource reports whether cfg sources stream through exactly
// transforms.
func hasArchiveSource(cfg jetstream.StreamConfig, stream string, transforms []jetstream.SubjectTransformConfig) bool {
	for _, src := range cfg.Sources {
		if src != nil && src.Name == stream && src.External == nil &&
			slices.Equal(src.SubjectTransforms, transforms) {
			return true
		}
	}
	return false
}
