//go:build !linux

package proc

import "errors"

// ReadUsage is Linux-only: elsewhere a harness reports no memory or CPU.
func ReadUsage(int) (Sample, error) {
	return Sample{}, errors.New("read process usage: only on Linux")
}
