package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cpuTimes are the machine's CPU times, all cores, in clock ticks, as
// /proc/stat's first line counts them.
type cpuTimes struct {
	total, steal uint64
}

// readCPUTimes reads /proc/stat; ok is false where there is none (not
// Linux) or it does not parse.
func readCPUTimes() (t cpuTimes, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, false
	}
	// user nice system idle iowait irq softirq steal [guest guest_nice]:
	// guest time is counted in user time already.
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		t.total += n
		if i == 7 {
			t.steal = n
		}
	}
	return t, true
}

// stealNote says how much of the machine's CPU time the hypervisor took
// for other guests between before and after: CPU time that the processes
// measured here were ready to use and did not get. Every figure in
// microseconds or milliseconds moves with it (the same code ran 3-8x
// slower in Go's own benchmarks at 30-50 % steal than on a quiet machine);
// ratios against a baseline measured beside it move less, and allocated
// bytes not at all. It returns "" where steal cannot be read.
func stealNote(before, after cpuTimes) string {
	if after.total <= before.total {
		return ""
	}
	pct := 100 * float64(after.steal-before.steal) / float64(after.total-before.total)
	note := fmt.Sprintf("machine: %.1f %% of the CPU time was stolen by the hypervisor during the run", pct)
	if pct >= 5 {
		note += "; time figures are inflated, and a bridge may fall behind where a quiet machine keeps up: compare ratios and allocated bytes, or measure again"
	}
	return note
}
