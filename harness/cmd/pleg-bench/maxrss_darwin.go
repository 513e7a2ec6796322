package main

// maxRSSBytes converts getrusage's ru_maxrss, in bytes on macOS, to bytes.
func maxRSSBytes(v int64) int64 { return v }
