package soak

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindAlertingBinaries(t *testing.T) {
	notFound := func(string) (string, error) { return "", errors.New("not found") }
	onPath := func(name string) (string, error) {
		if name == "prometheus" || name == "prometheus-alertmanager" {
			return "/usr/bin/" + name, nil
		}
		return "", errors.New("not found")
	}
	cache := t.TempDir()
	for _, p := range []string{filepath.Join(cache, prometheusCacheDir, "prometheus"), filepath.Join(cache, alertmanagerCacheDir, "alertmanager")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("PATH comes first, Debian's name for alertmanager included", func(t *testing.T) {
		p, a, err := FindAlertingBinaries(onPath, cache)
		if err != nil || p != "/usr/bin/prometheus" || a != "/usr/bin/prometheus-alertmanager" {
			t.Errorf("got %q, %q, %v; want both from PATH", p, a, err)
		}
	})
	t.Run("the cache is next", func(t *testing.T) {
		p, a, err := FindAlertingBinaries(notFound, cache)
		if err != nil || !strings.HasPrefix(p, cache) || !strings.HasPrefix(a, cache) {
			t.Errorf("got %q, %q, %v; want both from %s", p, a, err, cache)
		}
	})
	t.Run("missing ones are named with where they were looked for and how to get them", func(t *testing.T) {
		empty := t.TempDir()
		_, _, err := FindAlertingBinaries(notFound, empty)
		for _, want := range []string{"prometheus (not on PATH, nor " + empty, "alertmanager (not on PATH", ".ci/run"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("error = %v, want one containing %q", err, want)
			}
		}
	})
}
