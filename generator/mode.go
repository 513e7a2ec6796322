package generator

import (
	"fmt"
	"strconv"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Mode selects the generator's sources: the relist alone, or the event
// stream with a slower relist as a safety net.
type Mode string

// Modes.
const (
	// ModeAuto uses the event stream where the runtime supports a second
	// subscriber safely (containerd 2.0+, CRI-O 1.28+), else relists.
	ModeAuto Mode = "auto"
	// ModeEvented follows the event stream, with a slower relist as a
	// safety net, falling back to relisting while the stream fails.
	ModeEvented Mode = "evented"
	// ModeGeneric only relists; it never opens the event stream.
	ModeGeneric Mode = "generic"
)

// ParseMode checks a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeEvented, ModeGeneric:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q (want auto, evented or generic)", s)
}

// streamSupport decides from the runtime's Version whether subscribing to
// GetContainerEvents next to the kubelet is safe, and says why.
//
// containerd 1.7 serves every subscriber from one shared channel, so a second
// subscriber steals events from the kubelet: never subscribe there. CRI-O
// supports the stream from 1.28 (it closes it at once unless pod events are
// enabled; the fallback handles that).
func streamSupport(v *runtimeapi.VersionResponse) (bool, string) {
	name := strings.ToLower(v.GetRuntimeName())
	ver := v.GetRuntimeVersion()
	major, minor, ok := parseVersion(ver)
	switch {
	case strings.Contains(name, "containerd"):
		if !ok {
			return false, fmt.Sprintf("containerd version %q is not understood", ver)
		}
		if major < 2 {
			return false, fmt.Sprintf("containerd %s shares one event channel among subscribers; subscribing would steal the kubelet's events", ver)
		}
		return true, fmt.Sprintf("containerd %s fans events out to every subscriber", ver)
	case strings.Contains(name, "cri-o") || name == "crio":
		if !ok {
			return false, fmt.Sprintf("CRI-O version %q is not understood", ver)
		}
		if major < 1 || (major == 1 && minor < 28) {
			return false, fmt.Sprintf("CRI-O %s predates container events (1.28)", ver)
		}
		return true, fmt.Sprintf("CRI-O %s supports container events", ver)
	}
	return false, fmt.Sprintf("runtime %q %s is not known to support a second event subscriber", v.GetRuntimeName(), ver)
}

// parseVersion reads major and minor from versions such as "v2.4.2",
// "1.7.35", "1.28.1-dev" or "2.0.0-rc.1".
func parseVersion(s string) (major, minor int, ok bool) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minorStr := parts[1]
	if i := strings.IndexFunc(minorStr, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorStr = minorStr[:i]
	}
	minor, err2 := strconv.Atoi(minorStr)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return major, minor, true
}
