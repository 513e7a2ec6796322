package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestSoakRefusesBadFlagsNamingThem(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown fault", []string{"--faults", "nats-explode"}, `--faults: unknown fault "nats-explode"`},
		{"a cluster fault without a cluster", []string{"--faults", "leader-kill"}, "--faults: leader-kill needs a NATS cluster (--cluster)"},
		{"a duration too short for the faults", []string{"--duration", "5s"}, "--duration=5s is too short"},
		{"an argument", []string{"now"}, `unexpected argument "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"soak", "--dir", t.TempDir()}, tt.args...)
			err := run(t.Context(), args, envFrom(t, nil), &bytes.Buffer{}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}
