package generator

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Mode selects the generator's sources: the relist alone, or the event
// stream with a slower relist as a safety net.
type Mode string

// Modes.
const (
	// ModeAuto follows the runtime's events where that is safe: the CRI
	// event stream on runtimes that serve a second subscriber safely
	// (containerd 2.0+, CRI-O 1.28+), containerd's own event service as a
	// trigger on containerd 1.x, else relisting only.
	ModeAuto Mode = "auto"
	// ModeEvented follows the CRI event stream, with a slower relist as a
	// safety net, falling back to relisting while the stream fails.
	ModeEvented Mode = "evented"
	// ModeContainerdEvents follows containerd's own event service as a
	// trigger for targeted relists, with a slower relist as a safety net,
	// falling back to relisting while the subscription fails. It never
	// opens the CRI event stream.
	ModeContainerdEvents Mode = "containerd-events"
	// ModeGeneric only relists; it never opens an event stream.
	ModeGeneric Mode = "generic"
)

// DefaultMode is the mode of Options whose Mode is empty, and the
// product's: follow the runtime's events where that is safe.
const DefaultMode = ModeAuto

// ParseMode checks a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeEvented, ModeContainerdEvents, ModeGeneric:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q (want auto, evented, containerd-events or generic)", s)
}

// activeMode is the generator's active mode: ModeEvented while the stream is
// trusted, else ModeGeneric. The stream supervisor drives it; the relist
// loop (its period) and Healthy (its threshold) read it. Its methods are
// safe for concurrent use.
type activeMode struct {
	m      atomic.Value // Mode
	gauge  *prometheus.GaugeVec
	logger *slog.Logger
	// changed is called after a switch (or a "configured" set): the relist
	// loop re-times itself for the new period.
	changed func()
}

// newActiveMode returns the mode ModeGeneric, exported on gauge.
func newActiveMode(gauge *prometheus.GaugeVec, logger *slog.Logger, changed func()) *activeMode {
	a := &activeMode{gauge: gauge, logger: logger, changed: changed}
	a.m.Store(ModeGeneric)
	gauge.WithLabelValues(string(ModeGeneric)).Set(1)
	gauge.WithLabelValues(string(ModeEvented)).Set(0)
	return a
}

// get returns the active mode.
func (a *activeMode) get() Mode { return a.m.Load().(Mode) }

// set switches the active mode, logging the reason at Info.
func (a *activeMode) set(m Mode, reason string) {
	prev := a.m.Swap(m).(Mode)
	a.gauge.WithLabelValues(string(ModeEvented)).Set(b2f(m == ModeEvented))
	a.gauge.WithLabelValues(string(ModeGeneric)).Set(b2f(m == ModeGeneric))
	if prev != m || reason == "configured" {
		a.logger.Info("mode changed", "mode", m, "previous", prev, "reason", reason)
		a.changed()
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// eventSource is where the evented source takes the runtime's events from.
type eventSource int

const (
	sourceNone       eventSource = iota // relisting only
	sourceCRI                           // CRI GetContainerEvents
	sourceContainerd                    // containerd's event service, as a trigger
)

func (s eventSource) String() string {
	switch s {
	case sourceCRI:
		return "cri"
	case sourceContainerd:
		return "containerd"
	}
	return "none"
}

// chooseSource decides from the configured mode and the runtime's Version
// where to take events from, and says why.
//
// containerd 1.7 serves every GetContainerEvents subscriber from one shared
// channel, so a second subscriber steals events from the kubelet: never
// subscribe there. Its own event service gives every subscriber its own
// queue, so auto mode uses that on containerd 1.x. On containerd 2.x the CRI
// stream fans out and carries the pod's state in each message, which saves
// the trigger's listing: auto mode keeps it there. CRI-O supports the stream
// from 1.28 (it closes it at once unless pod events are enabled; the
// fallback handles that). A runtime that is not containerd never gets the
// containerd trigger.
func chooseSource(mode Mode, v *runtimeapi.VersionResponse) (eventSource, string) {
	name := strings.ToLower(v.GetRuntimeName())
	ver := v.GetRuntimeVersion()
	major, minor, ok := parseVersion(ver)
	containerd := strings.Contains(name, "containerd")
	if mode == ModeContainerdEvents {
		if !containerd {
			return sourceNone, fmt.Sprintf("runtime %q is not containerd, so it has no containerd event service", v.GetRuntimeName())
		}
		return sourceContainerd, fmt.Sprintf("containerd %s: its event service, as configured", ver)
	}
	switch {
	case containerd:
		if !ok {
			return sourceNone, fmt.Sprintf("containerd version %q is not understood", ver)
		}
		if major < 2 {
			return sourceContainerd, fmt.Sprintf("containerd %s shares one CRI event channel among subscribers (subscribing would steal the kubelet's events); its own event service gives each subscriber a queue", ver)
		}
		return sourceCRI, fmt.Sprintf("containerd %s fans CRI events out to every subscriber", ver)
	case strings.Contains(name, "cri-o") || name == "crio":
		if !ok {
			return sourceNone, fmt.Sprintf("CRI-O version %q is not understood", ver)
		}
		if major < 1 || (major == 1 && minor < 28) {
			return sourceNone, fmt.Sprintf("CRI-O %s predates container events (1.28)", ver)
		}
		return sourceCRI, fmt.Sprintf("CRI-O %s supports container events", ver)
	}
	return sourceNone, fmt.Sprintf("runtime %q %s is not known to support a second event subscriber", v.GetRuntimeName(), ver)
}

// isContainerd says whether v is containerd's.
func isContainerd(v *runtimeapi.VersionResponse) bool {
	return strings.Contains(strings.ToLower(v.GetRuntimeName()), "containerd")
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
