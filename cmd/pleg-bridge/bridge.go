package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
)

// bridge is one running pipeline: the generator reading the runtime and the
// publisher writing to JetStream.
type bridge struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	gen    *generator.Generator
	pub    *publish.Publisher
	ckpt   *checkpoint // nil without PLEG_DATA_DIR
	reg    *prometheus.Registry
	logger *slog.Logger
}

// newBridge wires a generator over rt to a publisher over nc. It does no
// I/O: Run sets up the stream.
func newBridge(cfg Config, rt generator.Runtime, nc *nats.Conn, logger *slog.Logger) (*bridge, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Stream setup and readiness; the publisher makes its own context for
	// publishing, with its ack handlers.
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("create JetStream context: %w", err)
	}
	enc, err := publish.NewEncoder(publish.EncoderOptions{
		Node: cfg.NodeName, ClusterName: cfg.ClusterName, SubjectPrefix: cfg.SubjectPrefix, Mode: cfg.CEMode,
	})
	if err != nil {
		return nil, fmt.Errorf("configure CloudEvents: %w", err)
	}
	var ckpt *checkpoint
	var published []generator.Event
	var onAck func(generator.Event)
	if cfg.DataDir != "" {
		ckpt, published = openCheckpoint(cfg.DataDir, cfg.NodeName, logger)
		onAck = ckpt.OnAck
	}
	pub, err := publish.New(js, publish.Options{
		OnAck:        onAck,
		Encoder:      enc,
		MaxInFlight:  cfg.PublishMaxInFlight,
		OutboxSize:   cfg.OutboxSize,
		DrainTimeout: cfg.ShutdownTimeout,
		Registerer:   reg,
		Logger:       logger,
	})
	if err != nil {
		return nil, err
	}
	metrics := generator.NewMetrics(reg)
	gen := generator.New(generator.InstrumentRuntime(rt, metrics), pub, generator.Options{
		Mode:                cfg.Mode,
		RelistPeriod:        cfg.RelistPeriod,
		RelistThreshold:     cfg.RelistThreshold,
		EventedRelistPeriod: cfg.EventedRelistPeriod,
		Published:           published,
		Logger:              logger,
		Metrics:             metrics,
	})
	return &bridge{cfg: cfg, nc: nc, js: js, gen: gen, pub: pub, ckpt: ckpt, reg: reg, logger: logger}, nil
}

// ensureStream creates the stream, waiting for NATS while it is unreachable
// (the bridge may start before its NATS server). Meanwhile the generator
// runs and the publisher retries, so events wait in the outbox rather than
// being lost. It returns an error only for a stream the bridge must not
// paper over, or when ctx ends.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg Config, logger *slog.Logger) error {
	opts := publish.StreamOptions{
		Name: cfg.Stream, SubjectPrefix: cfg.SubjectPrefix, Replicas: cfg.StreamReplicas,
		MaxAge: cfg.StreamMaxAge, DuplicateWindow: cfg.StreamDuplicateWindow, Logger: logger,
	}
	delay := 500 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := publish.EnsureStream(actx, js, opts)
		cancel()
		if err == nil {
			logger.Info("stream ready", "stream", cfg.Stream, "subjects", cfg.SubjectPrefix+".>")
			return nil
		}
		if !unreachable(err) || ctx.Err() != nil {
			return err
		}
		logger.Warn("cannot reach JetStream to set up the stream, retrying", "stream", cfg.Stream, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
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

// Run runs the pipeline and the HTTP endpoint until ctx is done. Shutdown
// order: the generator stops first, then the publisher delivers what is
// pending within PLEG_SHUTDOWN_TIMEOUT, then the checkpoint is written a last
// time and the HTTP server stops.
func (b *bridge) Run(ctx context.Context) error {
	pubCtx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPub()
	ckptCtx, stopCkpt := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCkpt()
	var srv *http.Server
	if b.cfg.ListenAddress != "" {
		srv = &http.Server{Addr: b.cfg.ListenAddress, Handler: b.handler(), ReadHeaderTimeout: 5 * time.Second}
	}
	eg, gctx := errgroup.WithContext(ctx)
	if b.cfg.StreamManage {
		eg.Go(func() error {
			if err := ensureStream(gctx, b.js, b.cfg, b.logger); err != nil && gctx.Err() == nil {
				return err
			}
			return nil
		})
	}
	eg.Go(func() error {
		defer stopCkpt() // every ack is in: write the last checkpoint
		err := b.pub.Run(pubCtx)
		if err != nil {
			return fmt.Errorf("publisher: %w", err)
		}
		return nil
	})
	if b.ckpt != nil {
		eg.Go(func() error { return b.ckpt.Run(ckptCtx) })
	} else {
		stopCkpt()
	}
	eg.Go(func() error {
		defer stopPub() // the generator is done: drain the publisher
		if err := b.gen.Run(gctx); err != nil {
			return fmt.Errorf("generator: %w", err)
		}
		return nil
	})
	if srv != nil {
		lis, err := net.Listen("tcp", b.cfg.ListenAddress)
		if err != nil {
			return fmt.Errorf("listen on PLEG_LISTEN_ADDRESS=%q: %w", b.cfg.ListenAddress, err)
		}
		b.logger.Info("serving metrics and health", "address", lis.Addr().String())
		eg.Go(func() error {
			if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve PLEG_LISTEN_ADDRESS=%q: %w", b.cfg.ListenAddress, err)
			}
			return nil
		})
		eg.Go(func() error {
			<-gctx.Done()
			<-pubCtx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	return eg.Wait()
}
