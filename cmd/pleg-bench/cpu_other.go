//go:build !(linux || darwin)

package main

import "time"

// cpuTime returns 0: the process's CPU time is not read on this system, and
// the relist table leaves its cpu columns out.
func cpuTime() time.Duration { return 0 }

// selfStats returns nothing: the process's figures are not read on this
// system.
func selfStats() childStats { return childStats{} }
