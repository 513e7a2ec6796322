//go:build !linux

package soak

import "os/exec"

// setDeathSignal does nothing where the kernel cannot kill a child with its
// parent: a soak that crashes leaves its bridge running there.
func setDeathSignal(*exec.Cmd) {}
