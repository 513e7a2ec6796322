//go:build linux || darwin

package main

import (
	"syscall"
	"time"
)

// selfStats returns this process's CPU time, peak resident set size,
// context switches and I/O syscalls as the kernel counts them.
func selfStats() childStats {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return childStats{}
	}
	return childStats{
		CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), MaxRSS: maxRSSBytes(ru.Maxrss),
		Switches: ru.Nvcsw + ru.Nivcsw, Syscalls: ioSyscalls(), DiskWritten: diskWritten(), Allocated: heapAllocated(),
	}
}
