//go:build !linux

package proc

import "syscall"

// sysProcAttr sets nothing: only Linux kills a child when its parent dies,
// and without that a group of its own would keep a terminal's Ctrl-C from
// the child that nothing else would stop.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup sends sig to pid alone: it leads no group of its own.
func signalGroup(pid int, sig syscall.Signal) error {
	return syscall.Kill(pid, sig)
}
