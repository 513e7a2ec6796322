package consumer

import (
	"strconv"
	"strings"
)

// Column widths of Format. A value longer than its column pushes the rest
// of the line to the right rather than being cut.
const (
	formatTypeWidth   = len("ContainerRemoved ")
	formatWhoWidth    = 26
	formatDetailWidth = 19
)

// Format renders e as one line of text without a trailing newline or
// color, in stable columns:
//
//	15:04:05.000 ContainerDied     default/web-0/app          exit=137 OOMKilled  node=node-1 via=relist
//
// The time is e.Time's time of day in its own location. A sandbox is shown
// as "<namespace>/<pod> (sandbox)". The detail column holds the exit code
// and reason of a ContainerDied (or its state when the exit code is not
// known) and the restart attempt of a ContainerStarted.
func Format(e Event) string {
	var b strings.Builder
	b.WriteString(e.Time.Format("15:04:05.000"))
	b.WriteByte(' ')
	pad(&b, e.LifecycleType(), formatTypeWidth)
	pad(&b, who(e), formatWhoWidth)
	pad(&b, detail(e), formatDetailWidth)
	b.WriteString("node=")
	b.WriteString(e.Node)
	if e.Data.DetectedBy != "" {
		b.WriteString(" via=")
		b.WriteString(e.Data.DetectedBy)
	}
	return b.String()
}

// pad writes s and at least one space, filling up to width.
func pad(b *strings.Builder, s string, width int) {
	b.WriteString(s)
	b.WriteString(strings.Repeat(" ", max(width-len(s), 0)+1))
}

// who names the container as namespace/pod/container, or the pod for a
// sandbox, falling back to the CloudEvent subject and then the pod UID when
// the data lacks the names.
func who(e Event) string {
	pod, c := e.Data.Pod, e.Data.Container
	if pod.Namespace == "" || pod.Name == "" {
		if e.Subject != "" {
			return e.Subject
		}
		return "pod " + e.PodUID
	}
	if c.Sandbox {
		return pod.Namespace + "/" + pod.Name + " (sandbox)"
	}
	return pod.Namespace + "/" + pod.Name + "/" + c.Name
}

func detail(e Event) string {
	d := e.Data
	switch e.LifecycleType() {
	case "ContainerStarted":
		if d.Container.Attempt > 0 {
			return "attempt=" + strconv.FormatUint(uint64(d.Container.Attempt), 10)
		}
	case "ContainerDied":
		var parts []string
		if code, ok := e.ExitCode(); ok {
			parts = append(parts, "exit="+strconv.Itoa(int(code)))
		} else if d.State != "" {
			parts = append(parts, "state="+d.State)
		}
		if d.Reason != "" {
			parts = append(parts, d.Reason)
		}
		return strings.Join(parts, " ")
	}
	return ""
}
