package main

// ioSyscalls returns 0: macOS has no /proc/self/io.
func ioSyscalls() int64 { return 0 }

// diskWritten returns 0: macOS has no /proc/self/io.
func diskWritten() int64 { return 0 }
