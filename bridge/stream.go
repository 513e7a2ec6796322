package bridge

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/publish"
)

// Bounds of the wait for JetStream while setting up the stream.
const (
	streamCallTimeout = 10 * time.Second
	streamRetryMin    = 500 * time.Millisecond
	streamRetryMax    = 10 * time.Second
)

// EnsureStream creates the stream opts describe (Stream, SubjectPrefix, and
// Logger; the rest of opts is not looked at) if it is missing, and its
// archive if opts.Stream.ArchiveMaxAge is set, waiting for JetStream while it is unreachable: the bridge
// may start before its NATS server, and meanwhile the generator runs and
// the publisher retries, so events wait rather than being lost. Run calls it
// when opts.Stream.Manage is set; the demo calls it to subscribe before the
// bridge runs. It returns an error only for a stream the bridge must not
// paper over (see publish.EnsureStream), or ctx.Err() when ctx ends. It
// blocks until then.
func EnsureStream(ctx context.Context, js jetstream.JetStream, opts Options) error {
	return ensureStream(ctx, js, opts.withDefaults(), nil)
}

// ensureStream is EnsureStream with the defaults applied. Each retry's log
// line carries advice(), if advice is set and says something: the setting
// that fixes what the server refused.
func ensureStream(ctx context.Context, js jetstream.JetStream, opts Options, advice func() string) error {
	sopts := publish.StreamOptions{
		Name: opts.Stream.Name, SubjectPrefix: opts.SubjectPrefix, Replicas: opts.Stream.Replicas,
		MaxAge: opts.Stream.MaxAge, DuplicateWindow: opts.Stream.DuplicateWindow, Version: opts.Version, Logger: opts.Logger,
	}
	var aopts *publish.ArchiveOptions
	if opts.Stream.ArchiveMaxAge > 0 {
		aopts = &publish.ArchiveOptions{
			Name: opts.Stream.ArchiveName, Stream: opts.Stream.Name, SubjectPrefix: opts.SubjectPrefix,
			Replicas: opts.Stream.Replicas, MaxAge: opts.Stream.ArchiveMaxAge,
			DuplicateWindow: opts.Stream.DuplicateWindow, Version: opts.Version, Logger: opts.Logger,
		}
	}
	delay := streamRetryMin
	streamReady := false
	for {
		actx, cancel := context.WithTimeout(ctx, streamCallTimeout)
		var err error
		if !streamReady {
			_, err = publish.EnsureStream(actx, js, sopts)
			if err == nil {
				streamReady = true
				opts.Logger.Info("stream ready", "stream", sopts.Name, "subjects", sopts.SubjectPrefix+".>")
			}
		}
		if err == nil && aopts != nil {
			var a jetstream.Stream
			if a, err = publish.EnsureArchive(actx, js, *aopts); err == nil {
				opts.Logger.Info("archive ready", "stream", a.CachedInfo().Config.Name, "source", sopts.Name,
					"max_age", aopts.MaxAge)
			}
		}
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !unreachable(err) {
			return err
		}
		attrs := []any{"stream", sopts.Name, "err", err, "retry_in", delay}
		if advice != nil {
			if fix := advice(); fix != "" {
				attrs = append(attrs, "fix", fix)
			}
		}
		opts.Logger.Warn("cannot reach JetStream to set up the stream, retrying", attrs...)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, streamRetryMax)
	}
}

// unreachable reports whether err means JetStream cannot be reached yet, as
// opposed to a stream configuration the bridge must not paper over.
func unreachable(err error) bool {
	for _, target := range []error{context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders,
		nats.ErrDisconnected, nats.ErrConnectionReconnecting, jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
