//go:build linux && !race

package natsembed

import (
	"unsafe"

	// The sampler whose path is linked to below.
	_ "github.com/nats-io/nats-server/v2/server/pse"
)

// pseProcStatFile is the file nats-server's process sampler reads: the
// process's /proc/<pid>/stat, set when its package is initialised.
//
//go:linkname pseProcStatFile github.com/nats-io/nats-server/v2/server/pse.procStatFile
var pseProcStatFile string

func init() { stopProcessSampler() }

// stopProcessSampler ends nats-server's process sampler.
//
// From the moment a binary that links nats-server starts, the sampler reads
// /proc/<pid>/stat and the system's uptime once a second, for the CPU share
// a server reports in its monitoring. It does this whether a server runs or
// not. Each read is a timer, a goroutine and five system calls, and it also
// wakes the runtime's monitor thread. On an idle 2-vCPU VM that cost 0.023 %
// of a core, two thirds of an idle evented bridge at 110 pods (pleg-bench,
// strace and /proc schedstat, 2026-11-27). Every node runs a bridge, nearly
// all of them against an external NATS, and its embedded server serves no
// monitoring: its self-reported CPU and memory then read 0.
//
// The sampler stops at its next run if the file cannot be read, so this
// empties the path. Only its length is written: one machine word, which a
// sampler reading the path at the same moment sees whole (the Go memory
// model), old or new. It runs in init, long before the sampler's first
// run, 1 s after its own init. The race detector's builds leave the sampler
// alone, since the write is not ordered with the sampler's reads in its
// model. nats-server defines the variable on Linux only; elsewhere the
// sampler is left as it is.
func stopProcessSampler() {
	*(*int)(unsafe.Add(unsafe.Pointer(&pseProcStatFile), unsafe.Sizeof(uintptr(0)))) = 0
}
