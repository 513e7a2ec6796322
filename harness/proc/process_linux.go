package proc

import "syscall"

// sysProcAttr puts a child in a process group of its own, which its
// signals go to and a terminal's Ctrl-C does not reach, and has the kernel
// kill it if the harness dies first, so that no child outlives it holding
// ports and stores.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup sends sig to the process group that pid leads.
func signalGroup(pid int, sig syscall.Signal) error {
	return syscall.Kill(-pid, sig)
}
