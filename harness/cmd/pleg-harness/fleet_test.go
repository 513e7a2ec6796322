package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

func TestFleetCommand(t *testing.T) {
	t.Parallel()
	none := func(string) (string, bool) { return "", false }
	t.Run("a bad flag value is reported with the flag's name", func(t *testing.T) {
		t.Parallel()
		err := run(context.Background(), []string{"fleet", "--kill-fraction", "2", "--dir", t.TempDir()}, none, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--kill-fraction=2") {
			t.Errorf("err = %v, want one naming --kill-fraction=2", err)
		}
	})
	t.Run("the hidden child command refuses to run without its spec", func(t *testing.T) {
		t.Parallel()
		err := run(context.Background(), []string{"fleet", "child"}, none, io.Discard, io.Discard)
		if cli.Report(err, "pleg-harness", io.Discard) != 2 || !strings.Contains(err.Error(), "PLEG_FLEET_CHILD") {
			t.Errorf("err = %v, want a usage error naming PLEG_FLEET_CHILD", err)
		}
	})
	t.Run("the fleet is in the usage", func(t *testing.T) {
		t.Parallel()
		var out strings.Builder
		if err := run(context.Background(), []string{"--help"}, none, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "\n  fleet ") {
			t.Errorf("usage does not list the fleet command:\n%s", out.String())
		}
	})
}
