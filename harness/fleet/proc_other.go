//go:build !linux

package fleet

import "errors"

// readProc is Linux-only: elsewhere the table shows no memory or CPU.
func readProc(int) (procSample, error) {
	return procSample{}, errors.New("read process usage: only on Linux")
}
