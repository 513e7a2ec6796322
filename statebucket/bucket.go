package statebucket

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/publish"
)

// open returns the bucket, created with Manage if missing, and the TTL to
// give delete markers (0 when the bucket has no marker TTLs). It retries
// while JetStream is unreachable (or the bucket missing, without Manage).
func (w *Writer) open(ctx context.Context) (jetstream.KeyValue, time.Duration, error) {
	failures := 0
	for {
		kv, err := w.openOnce(ctx)
		var st jetstream.KeyValueStatus
		if err == nil {
			st, err = kv.Status(ctx)
			if err == nil {
				// The bucket's own marker TTL, also for one an operator
				// made: the purges' markers live as long as its others.
				ttl := st.LimitMarkerTTL()
				if ttl == 0 {
					w.log.Warn("the state bucket has no marker TTL: markers of removed containers stay until its deletes are purged")
				}
				w.log.Info("state bucket ready", "node", w.node)
				return kv, ttl, nil
			}
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		failures++
		d := publish.RetryDelay(w.opts.RetryBackoffMin, w.opts.RetryBackoffMax, failures)
		switch {
		case !unreachable(err):
			// Permissions, a bucket that is not one: an operator must
			// act. The stream does not depend on the bucket, so the
			// bridge goes on, and so does the writer, slowly.
			d = w.opts.RetryBackoffMax
			if failures == 1 {
				w.log.Error("cannot use the state bucket, will retry", "err", err, "retry_in", d)
			}
		case failures == 1:
			w.log.Warn("cannot open the state bucket, will retry", "err", err, "retry_in", d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, 0, ctx.Err()
		case <-t.C:
		}
	}
}

func (w *Writer) openOnce(ctx context.Context) (jetstream.KeyValue, error) {
	cctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return Ensure(cctx, w.js, w.opts)
}

// Ensure returns the state bucket opts.Bucket and, with
// opts.Manage, creates it if it is missing: history 1 (one message per
// key), file storage, opts.Replicas replicas, and delete markers kept
// opts.MarkerTTL (0: DefaultMarkerTTL), and the contract version and
// opts.Version in its metadata (schemas.MetadataContractVersion,
// schemas.MetadataVersion). An existing bucket is used as it is, its
// metadata included: a bridge's user may only create the bucket, and the
// bucket's keys, unlike the stream's subjects, have not changed with the
// contract so far. Only Bucket, Manage, Replicas, MarkerTTL and Version of
// opts are read. It makes one attempt; Writer.Run calls it until it
// succeeds.
func Ensure(ctx context.Context, js jetstream.JetStream, opts Options) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, opts.Bucket)
	if !errors.Is(err, jetstream.ErrBucketNotFound) || !opts.Manage {
		return kv, err
	}
	kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         opts.Bucket,
		Description:    "pleg-bridge: the latest lifecycle event of every container, one key per container",
		History:        1,
		Replicas:       max(opts.Replicas, 1),
		Storage:        jetstream.FileStorage,
		LimitMarkerTTL: cmp.Or(opts.MarkerTTL, DefaultMarkerTTL),
		Metadata:       publish.ContractMetadata(opts.Version),
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		// Another node created it meanwhile.
		return js.KeyValue(ctx, opts.Bucket)
	}
	return kv, err
}

// unreachable reports whether err means the bucket cannot be reached
// (yet), rather than one the writer cannot use.
func unreachable(err error) bool {
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return true
	}
	for _, target := range []error{context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders,
		nats.ErrDisconnected, nats.ErrConnectionReconnecting, jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
