package proc

import (
	"fmt"
	"time"
)

// Sample is one reading of a process's memory and CPU, as the kernel
// counts them.
type Sample struct {
	RSS     int64         // resident memory now, bytes (VmRSS)
	PeakRSS int64         // resident memory at its peak, bytes (VmHWM)
	CPU     time.Duration // user + system time since it started, all threads
}

// Usage reads the current incarnation's memory and CPU and returns them
// with its process ID, which tells incarnations apart. It fails if none
// runs, and off Linux.
func (p *Process) Usage() (Sample, int, error) {
	pid := p.PID()
	if pid == 0 {
		return Sample{}, 0, fmt.Errorf("read the usage of %s: it is not running", p.name)
	}
	s, err := ReadUsage(pid)
	return s, pid, err
}
