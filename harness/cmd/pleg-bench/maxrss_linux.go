package main

// maxRSSBytes converts getrusage's ru_maxrss, in KiB on Linux, to bytes.
func maxRSSBytes(v int64) int64 { return v << 10 }
