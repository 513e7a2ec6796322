package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

func died(code int32, reason string) consumer.Event {
	return consumer.Event{
		Type: schemas.TypeContainerDied,
		Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Data: schemas.EventData{
			Pod:       schemas.Pod{UID: "u1", Namespace: "shop", Name: "web-0"},
			Container: schemas.Container{ID: "c1", Name: "app"},
			ExitCode:  &code, Reason: reason,
		},
	}
}

func TestPrinterHighlightsOnlyTroubleAndOnlyInColor(t *testing.T) {
	t.Parallel()
	started := died(0, "")
	started.Type = schemas.TypeContainerStarted
	started.Data.ExitCode = nil
	tests := []struct {
		name  string
		e     consumer.Event
		color bool
		red   bool
	}{
		{name: "a non-zero exit is red", e: died(1, "Error"), color: true, red: true},
		{name: "OOMKilled is red", e: died(137, "OOMKilled"), color: true, red: true},
		{name: "OOMKilled without an exit code is red", e: func() consumer.Event { e := died(0, "OOMKilled"); e.Data.ExitCode = nil; return e }(), color: true, red: true},
		{name: "a clean exit is not", e: died(0, "Completed"), color: true},
		{name: "a start is not", e: started, color: true},
		{name: "nothing is red without colour", e: died(137, "OOMKilled")},
	}
	for _, tt := range tests {
		var b strings.Builder
		if err := (printer{w: &b, color: tt.color, date: true}).print(tt.e); err != nil {
			t.Fatal(err)
		}
		line := b.String()
		want := "2026-01-02 " + consumer.Format(tt.e)
		if tt.red {
			want = "\x1b[1;31m" + want + "\x1b[0m"
		}
		if line != want+"\n" {
			t.Errorf("%s: printed %q, want %q", tt.name, line, want+"\n")
		}
	}
}

func TestUseColor(t *testing.T) {
	t.Parallel()
	file, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	noColor := func(k string) string { return map[string]string{"NO_COLOR": "1"}[k] }
	none := func(string) string { return "" }
	tests := []struct {
		name   string
		mode   string
		getenv func(string) string
		want   bool
	}{
		{name: "always colours a file", mode: "always", getenv: none, want: true},
		{name: "always overrides NO_COLOR", mode: "always", getenv: noColor, want: true},
		{name: "never does not", mode: "never", getenv: none},
		{name: "auto does not colour a file", mode: "auto", getenv: none},
	}
	for _, tt := range tests {
		got, err := useColor(tt.mode, file, tt.getenv)
		if err != nil || got != tt.want {
			t.Errorf("%s: useColor = %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
	if _, err := useColor("yes", file, none); err == nil || !strings.Contains(err.Error(), "--color") {
		t.Errorf("useColor(yes) = %v, want an error naming --color", err)
	}
}
