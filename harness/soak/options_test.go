package soak

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestTheFaultsSaidToFitAreAccepted: the faults a too-short --duration's
// error names are accepted with that duration.
func TestTheFaultsSaidToFitAreAccepted(t *testing.T) {
	for _, d := range []time.Duration{5 * time.Second, 14 * time.Second, 30 * time.Second, time.Minute, 90 * time.Second, 2 * time.Minute} {
		for _, cluster := range []bool{false, true} {
			o := Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Duration: d, Cluster: cluster}
			all, err := o.withDefaults()
			var oe *OptionsError
			if err != nil && !errors.As(err, &oe) {
				t.Fatalf("%v: error %v is not an *OptionsError", d, err)
			}
			if err == nil {
				continue
			}
			o.Faults = all.fittingFaults()
			if len(o.Faults) == 0 {
				continue
			}
			if _, err := o.withDefaults(); err != nil {
				t.Errorf("duration %v, cluster %t: the faults said to fit, %v, are refused: %v", d, cluster, o.Faults, err)
			}
		}
	}
}

func TestOptionsDefaults(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		wantFaults []string
		wantErr    string // a part of the error, empty for none
	}{
		{
			name:       "a single server gets every fault but those of a cluster",
			opts:       Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge"},
			wantFaults: []string{FaultNATSRestart, FaultNATSOutage, FaultBridgeKill, FaultOutageBridgeKill, FaultRuntimeRestart, FaultStreamDrop},
		},
		{
			name: "a cluster gets every fault but those added for alerts",
			opts: Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Cluster: true},
			wantFaults: []string{FaultNATSRestart, FaultNATSOutage, FaultLeaderKill, FaultMetaLeaderChange,
				FaultBridgeKill, FaultOutageBridgeKill, FaultRuntimeRestart, FaultStreamDrop},
		},
		{
			name:       "with Prometheus, every fault that fires an alert",
			opts:       alertingOptions(Options{}),
			wantFaults: []string{FaultNATSOutage, FaultBridgeKill, FaultBridgeGone, FaultRuntimeRestart, FaultStreamRefused},
		},
		{
			name:       "with Prometheus, no fault at all",
			opts:       alertingOptions(Options{Faults: []string{}, Duration: time.Minute}),
			wantFaults: []string{},
		},
		{
			name:    "with Prometheus, a duration too short for the faults' alerts says how long it must be",
			opts:    alertingOptions(Options{Duration: time.Minute}),
			wantErr: "--duration=1m0s is too short for 5 faults with --prometheus",
		},
		{
			name:    "a scrape target cannot go without Prometheus",
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Faults: []string{FaultBridgeGone}},
			wantErr: "--faults: bridge-gone takes a scrape target away: it needs --prometheus",
		},
		{
			name:    "the CRI event stream cannot be refused to a bridge that follows containerd 1.7's events",
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Containerd17: true, Faults: []string{FaultStreamRefused}},
			wantErr: "--faults: stream-refused refuses CRI's event stream",
		},
		{
			name:    "Prometheus needs its binaries",
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Prometheus: true, RulesFile: "../../deploy/prometheus/rules.yml", DashboardFile: "../../deploy/grafana/pleg-bridge.json"},
			wantErr: "--prometheus: the prometheus and alertmanager binaries to run are not set",
		},
		{
			name:    "Prometheus needs the rules",
			opts:    alertingOptions(Options{RulesFile: "no-such-rules.yml"}),
			wantErr: "--prometheus: read the alerting rules",
		},
		{
			name:       "faults named in any order run in schedule order",
			opts:       Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Faults: []string{FaultStreamDrop, FaultNATSRestart}},
			wantFaults: []string{FaultNATSRestart, FaultStreamDrop},
		},
		{
			name:    "an unknown fault is refused with the known ones",
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Faults: []string{"nats-explode"}},
			wantErr: `--faults: unknown fault "nats-explode"; known: nats-restart, nats-outage`,
		},
		{
			name:    "a cluster fault needs a cluster",
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Faults: []string{FaultLeaderKill}},
			wantErr: "--faults: leader-kill needs a NATS cluster (--cluster)",
		},
		{
			name: "a duration too short for the faults says how long it must be",
			// 8 windows of 1.75s, and the outage with a kill in it needs
			// 2*5s+1s, then 3s+1s for the kill, and 1s of quiet.
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Duration: 14 * time.Second},
			wantErr: "--duration=14s is too short for 6 faults: the run is cut into 8 equal windows (a baseline, one per fault, a recovery) and the longest fault needs 16s, so at least 2m8s; in 14s, --faults nats-restart fits",
		},
		{
			name: "a minute names the faults that fit in it",
			// 6 windows of 10s hold nats-restart (2s), runtime-restart and
			// stream-drop (4s) and bridge-kill (6s); 7 windows of 8.6s do
			// not hold nats-outage (11s).
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Duration: time.Minute},
			wantErr: "in 1m0s, --faults nats-restart,bridge-kill,runtime-restart,stream-drop fits (or fewer of them, or --faults none)",
		},
		{
			name:    "a duration too short for any fault says to name none",
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", Duration: 5 * time.Second},
			wantErr: "in 5s, no fault fits: --faults none",
		},
		{
			name:    "a run directory too long for a unix socket is refused",
			opts:    Options{Dir: "/" + strings.Repeat("d", 100), BridgeBinary: "pleg-bridge"},
			wantErr: "the runtime's unix socket needs it within 90",
		},
		{
			name:    "an outbox smaller than the publishing window is refused",
			opts:    Options{Dir: "/tmp/s", BridgeBinary: "pleg-bridge", OutboxSize: 8, MaxInFlight: 16},
			wantErr: "--outbox=8, --max-in-flight=16",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.opts.withDefaults()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantFaults, got.Faults); diff != "" {
				t.Errorf("faults (-want +got):\n%s", diff)
			}
		})
	}
}

// alertingOptions returns o with Prometheus on and what it needs set.
func alertingOptions(o Options) Options {
	o.Dir, o.BridgeBinary, o.Prometheus = "/tmp/s", "pleg-bridge", true
	o.PrometheusBinary, o.AlertmanagerBinary = "prometheus", "alertmanager"
	if o.RulesFile == "" {
		o.RulesFile = "../../deploy/prometheus/rules.yml"
	}
	o.DashboardFile = "../../deploy/grafana/pleg-bridge.json"
	return o
}
