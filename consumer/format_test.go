package consumer_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

func TestFormat(t *testing.T) {
	t.Parallel()
	sandbox := died()
	sandbox.lifecycle, sandbox.sandbox, sandbox.container = "ContainerStarted", true, ""
	sandbox.exitCode, sandbox.reason = nil, ""

	restarted := died()
	restarted.lifecycle, restarted.attempt = "ContainerStarted", 3
	restarted.exitCode, restarted.reason = nil, ""

	removed := died()
	removed.lifecycle, removed.exitCode, removed.reason = "ContainerRemoved", nil, ""

	lost := died()
	lost.exitCode, lost.reason, lost.state = nil, "", "unknown"

	completed := died()
	completed.exitCode, completed.reason = exitCode(0), "Completed"

	long := died()
	long.namespace, long.pod, long.container = "kube-system", "kube-proxy-abcde", "kube-proxy"

	unnamed := died().event(t, subject)
	unnamed.Data.Pod.Namespace, unnamed.Data.Pod.Name = "", ""
	anonymous := unnamed
	anonymous.Subject = ""

	tests := []struct {
		name string
		e    consumer.Event
		want string
	}{
		{
			name: "a container killed for memory shows exit code and reason",
			e:    died().event(t, subject),
			want: "03:04:05.123 ContainerDied     default/web-0/app          exit=137 OOMKilled  node=node-1 via=relist",
		},
		{
			name: "a clean exit shows exit code 0",
			e:    completed.event(t, subject),
			want: "03:04:05.123 ContainerDied     default/web-0/app          exit=0 Completed    node=node-1 via=relist",
		},
		{
			name: "a container found gone without exit code shows its state",
			e:    lost.event(t, subject),
			want: "03:04:05.123 ContainerDied     default/web-0/app          state=unknown       node=node-1 via=relist",
		},
		{
			name: "a sandbox is shown as the pod with a sandbox mark",
			e:    sandbox.event(t, subject),
			want: "03:04:05.123 ContainerStarted  default/web-0 (sandbox)    " + "                    node=node-1 via=relist",
		},
		{
			name: "a restarted container shows its attempt",
			e:    restarted.event(t, subject),
			want: "03:04:05.123 ContainerStarted  default/web-0/app          attempt=3           node=node-1 via=relist",
		},
		{
			name: "a removal has no detail",
			e:    removed.event(t, subject),
			want: "03:04:05.123 ContainerRemoved  default/web-0/app                              node=node-1 via=relist",
		},
		{
			name: "a name longer than its column pushes the rest right by one space",
			e:    long.event(t, subject),
			want: "03:04:05.123 ContainerDied     kube-system/kube-proxy-abcde/kube-proxy exit=137 OOMKilled  node=node-1 via=relist",
		},
		{
			name: "an event without pod names falls back to the CloudEvent subject",
			e:    unnamed,
			want: "03:04:05.123 ContainerDied     default/web-0/app          exit=137 OOMKilled  node=node-1 via=relist",
		},
		{
			name: "an event without names or subject falls back to the pod UID",
			e:    anonymous,
			want: "03:04:05.123 ContainerDied     pod 6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70 exit=137 OOMKilled  node=node-1 via=relist",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := consumer.Format(tt.e); got != tt.want {
				t.Errorf("Format:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestExitCodePrintsAsANumber: the exit code reads as a number through
// ExitCode and when the event itself is printed, never as the address
// Data.ExitCode holds; 0 and no exit code differ.
func TestExitCodePrintsAsANumber(t *testing.T) {
	t.Parallel()
	oom := died().event(t, subject)
	completed := died()
	completed.exitCode, completed.reason = exitCode(0), "Completed"
	lost := died()
	lost.exitCode, lost.reason, lost.state = nil, "", "unknown"

	tests := []struct {
		name     string
		e        consumer.Event
		code     int32
		ok       bool
		sprintIn string
	}{
		{name: "an OOMKilled container's exit code is 137", e: oom, code: 137, ok: true, sprintIn: "exit=137 OOMKilled"},
		{name: "a completed container's exit code 0 is known", e: completed.event(t, subject), code: 0, ok: true, sprintIn: "exit=0 Completed"},
		{name: "a container found gone has no exit code", e: lost.event(t, subject), code: 0, ok: false, sprintIn: "state=unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, ok := tt.e.ExitCode()
			if code != tt.code || ok != tt.ok {
				t.Errorf("ExitCode() = %d, %t; want %d, %t", code, ok, tt.code, tt.ok)
			}
			for _, got := range []string{fmt.Sprint(tt.e), fmt.Sprintf("%v", tt.e)} {
				if !strings.Contains(got, tt.sprintIn) || strings.Contains(got, "0x") {
					t.Errorf("the event prints as %q, want it to hold %q and no address", got, tt.sprintIn)
				}
			}
		})
	}
}
