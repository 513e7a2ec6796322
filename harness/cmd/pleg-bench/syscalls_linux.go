package main

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// ioSyscalls returns the read and write system calls this process made
// (syscr + syscw of /proc/self/io), or 0 if they cannot be read.
func ioSyscalls() int64 { return procIO("syscr", "syscw") }

// diskWritten returns the bytes this process caused to be written to
// storage (write_bytes of /proc/self/io: the pages it dirtied, whenever
// the kernel writes them back), or 0 if they cannot be read.
func diskWritten() int64 { return procIO("write_bytes") }

// procIO returns the sum of the named counters of /proc/self/io, or 0 if
// they cannot be read.
func procIO(keys ...string) int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	var n int64
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok || !slices.Contains(keys, k) {
			continue
		}
		c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0
		}
		n += c
	}
	return n
}
