package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// handler serves /metrics, /healthz and /readyz.
func (b *bridge) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(b.reg, promhttp.HandlerOpts{Registry: b.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := b.gen.Healthy(time.Now()); err != nil {
			http.Error(w, "PLEG is not healthy: "+err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := b.ready(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// ready says why the bridge is not ready: NATS disconnected, the stream
// unreachable, or no relist done yet.
func (b *bridge) ready(ctx context.Context) error {
	if s := b.nc.Status(); s != nats.CONNECTED {
		return fmt.Errorf("NATS is %s", s)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := b.js.Stream(ctx, b.cfg.Stream); err != nil {
		return fmt.Errorf("stream %s is not reachable: %v", b.cfg.Stream, err)
	}
	if !b.gen.Synced() {
		return fmt.Errorf("first relist not done yet")
	}
	return nil
}
