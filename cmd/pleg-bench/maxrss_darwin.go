package main

// maxRSSBytes converts getrusage's ru_maxrss, in bytes on macOS, to bytes.
func maxRSSBytes(v int64) int64 { return v }

// ioSyscalls returns 0: macOS has no /proc/self/io.
func ioSyscalls() int64 { return 0 }
