package main

import (
	"runtime"
	"strings"
	"testing"
)

func TestStealNote(t *testing.T) {
	before := cpuTimes{total: 1000, steal: 100}
	quiet := stealNote(before, cpuTimes{total: 2000, steal: 110})
	if !strings.Contains(quiet, "1.0 %") || strings.Contains(quiet, "inflated") {
		t.Errorf("1%% steal: %q", quiet)
	}
	busy := stealNote(before, cpuTimes{total: 2000, steal: 500})
	if !strings.Contains(busy, "40.0 %") || !strings.Contains(busy, "inflated") {
		t.Errorf("40%% steal: %q", busy)
	}
	if n := stealNote(before, before); n != "" {
		t.Errorf("no time passed: %q", n)
	}
}

func TestReadCPUTimes(t *testing.T) {
	c, ok := readCPUTimes()
	if runtime.GOOS != "linux" {
		if ok {
			t.Errorf("read CPU times on %s: %+v", runtime.GOOS, c)
		}
		return
	}
	if !ok || c.total == 0 || c.steal > c.total {
		t.Fatalf("readCPUTimes() = %+v, %v", c, ok)
	}
}
