//go:build linux || darwin

package main

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user and system) the process has used so
// far, or 0 if it cannot be read.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// selfStats returns this process's CPU time and peak resident set size as
// the kernel counts them.
func selfStats() childStats {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return childStats{}
	}
	return childStats{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), MaxRSS: maxRSSBytes(ru.Maxrss)}
}
