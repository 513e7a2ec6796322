//go:build !(linux || darwin)

package latencybench

import "time"

// processCPU returns 0: the process's CPU time is not read on this system,
// and results leave it out.
func processCPU() time.Duration { return 0 }
