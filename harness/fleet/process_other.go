//go:build !linux

package fleet

import "os/exec"

// setDeathSignal does nothing: only Linux kills a child when its parent
// dies.
func setDeathSignal(*exec.Cmd) {}
