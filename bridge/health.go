package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readyStreamTimeout bounds /readyz's look at the stream.
const readyStreamTimeout = 2 * time.Second

// handler serves /metrics, /healthz and /readyz for p.
//
// /healthz is about the runtime side only: it fails, in the kubelet's
// words, when the last good relist is older than the relist threshold.
// NATS being away must not get the pod restarted; that is /readyz's.
func (p *pipeline) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{Registry: p.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := p.gen.Healthy(time.Now()); err != nil {
			http.Error(w, "PLEG is not healthy: "+err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := p.ready(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// ready says why the bridge is not ready: NATS disconnected, the stream
// unreachable, or no relist done yet. An unreachable stream comes with the
// setting that fixes what the server refused the bridge, if it refused
// something a setting fixes (refusals), or with the way to create the
// stream when the bridge leaves that to the operator.
func (p *pipeline) ready(ctx context.Context) error {
	if s := p.nc.Status(); s != nats.CONNECTED {
		return fmt.Errorf("NATS is %s", s)
	}
	ctx, cancel := context.WithTimeout(ctx, readyStreamTimeout)
	defer cancel()
	if _, err := p.js.Stream(ctx, p.opts.Stream.Name); err != nil {
		fix := p.refused.advice()
		if fix == "" && errors.Is(err, jetstream.ErrStreamNotFound) && !p.opts.Stream.Manage {
			fix = "the bridge leaves the stream to the operator (PLEG_STREAM_MANAGE=false): create it once (deploy/nats/README.md, \"Creating the stream yourself\")"
		}
		if fix != "" {
			return fmt.Errorf("stream %s is not reachable: %v: %s", p.opts.Stream.Name, err, fix)
		}
		return fmt.Errorf("stream %s is not reachable: %v", p.opts.Stream.Name, err)
	}
	if !p.gen.Synced() {
		return fmt.Errorf("first relist not done yet")
	}
	return nil
}
