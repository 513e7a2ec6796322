package main

import (
	"os"
	"path/filepath"
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

func TestIOSyscallsCountsAWrite(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/self/io is Linux's")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := ioSyscalls()
	for range 10 {
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if after := ioSyscalls(); before <= 0 || after-before < 10 {
		t.Fatalf("ioSyscalls() went from %d to %d over 10 writes", before, after)
	}
}
