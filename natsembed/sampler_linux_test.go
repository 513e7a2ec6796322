//go:build linux && !race

package natsembed

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server/pse"
)

// TestNATSProcessSamplerIsOff checks that nats-server's process sampler has
// nothing to read once this package is initialised, so that it ended at
// its first run (see stopProcessSampler), and that a server still starts
// and serves. Without the change, the path is /proc/<pid>/stat and
// ProcUsage reads it.
func TestNATSProcessSamplerIsOff(t *testing.T) {
	if pseProcStatFile != "" {
		t.Fatalf("the sampler's path is %q, want it empty", pseProcStatFile)
	}
	var pcpu float64
	var rss, vss int64
	if err := pse.ProcUsage(&pcpu, &rss, &vss); err == nil {
		t.Fatalf("pse.ProcUsage read the process's stat (rss %d): the sampler can read it too", rss)
	}
	s, err := Start(Options{DataDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	if !s.JetStreamEnabled() {
		t.Fatal("the embedded server started without JetStream")
	}
}
