package fleet

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the child if the harness dies first,
// so that no server or bridge outlives it holding ports and stores.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
