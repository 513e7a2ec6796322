package soak

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the bridge if the soak dies first, so a
// soak that crashes or is killed leaves no bridge behind holding its ports.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
