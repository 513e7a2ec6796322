package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

func TestParseTypeTakesShortFormsInAnyCase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
	}{
		{"died", "ContainerDied"},
		{"Died", "ContainerDied"},
		{"DIED", "ContainerDied"},
		{"ContainerDied", "ContainerDied"},
		{"containerdied", "ContainerDied"},
		{"pleg.v1.ContainerDied", "ContainerDied"},
		{" started ", "ContainerStarted"},
		{"Started", "ContainerStarted"},
		{"removed", "ContainerRemoved"},
		{"ContainerRemoved", "ContainerRemoved"},
	}
	for _, tt := range tests {
		got, err := parseType(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("parseType(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"changed", "ContainerChanged", "container", "die", "pleg.v2.ContainerDied", "died,removed"} {
		if got, err := parseType(in); err == nil {
			t.Errorf("parseType(%q) = %q, want an error", in, got)
		}
	}
}

// TestTypeNamesAreTheGoAPIs: every name --type takes, consumer.Filter takes
// too, for the same type; a service written from `tail --type died` works.
func TestTypeNamesAreTheGoAPIs(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"died", "Started", "REMOVED", "ContainerDied", "pleg.v1.ContainerStarted"} {
		typ, err := parseType(in)
		if err != nil {
			t.Fatalf("parseType(%q): %v", in, err)
		}
		got, err := consumer.Filter{Type: in}.Subject("pleg")
		if want := "pleg.*.*.*." + typ; err != nil || got != want {
			t.Errorf("consumer.Filter{Type: %q}.Subject = %q, %v; want %q as --type %s selects", in, got, err, want, in)
		}
	}
}

func TestParsePodTellsAUIDFromNamespaceAndName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in                   string
		uid, namespace, name string
		wantErr              bool
	}{
		{in: "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", uid: "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70"},
		{in: "web-0", uid: "web-0"},
		{in: "default/web-0", namespace: "default", name: "web-0"},
		{in: "default/", wantErr: true},
		{in: "/web-0", wantErr: true},
		{in: "a/b/c", wantErr: true},
		{in: ""},
	}
	for _, tt := range tests {
		uid, ns, name, err := parsePod(tt.in)
		if (err != nil) != tt.wantErr || uid != tt.uid || ns != tt.namespace || name != tt.name {
			t.Errorf("parsePod(%q) = %q, %q, %q, %v; want %q, %q, %q, error %v", tt.in, uid, ns, name, err, tt.uid, tt.namespace, tt.name, tt.wantErr)
		}
	}
}

func TestEventFilterMatchesOnNames(t *testing.T) {
	t.Parallel()
	app := consumer.Event{Data: schemas.EventData{
		Pod:       schemas.Pod{UID: "u1", Namespace: "shop", Name: "web-0"},
		Container: schemas.Container{ID: "c1", Name: "app"},
	}}
	sandbox := consumer.Event{Data: schemas.EventData{
		Pod:       schemas.Pod{UID: "u1", Namespace: "shop", Name: "web-0"},
		Container: schemas.Container{ID: "s1", Name: "web-0", Sandbox: true},
	}}
	// An event whose data lacks the names, as a producer other than the
	// bridge might write it: the CloudEvent subject still has them.
	bare := consumer.Event{Subject: "shop/web-0/app", Data: schemas.EventData{Pod: schemas.Pod{UID: "u1"}, Container: schemas.Container{ID: "c1"}}}
	tests := []struct {
		name   string
		filter eventFilter
		want   []bool // app, sandbox, bare
	}{
		{name: "the zero filter matches everything", want: []bool{true, true, true}},
		{name: "a namespace matches its pods", filter: eventFilter{namespace: "shop"}, want: []bool{true, true, true}},
		{name: "another namespace matches nothing", filter: eventFilter{namespace: "default"}, want: []bool{false, false, false}},
		{name: "namespace and name match the pod", filter: eventFilter{namespace: "shop", pod: "web-0"}, want: []bool{true, true, true}},
		{name: "a name in another namespace matches nothing", filter: eventFilter{namespace: "other", pod: "web-0"}, want: []bool{false, false, false}},
		{name: "a container name does not match the sandbox", filter: eventFilter{container: "app"}, want: []bool{true, false, true}},
		{name: "the pod's name is not a container name", filter: eventFilter{container: "web-0"}, want: []bool{false, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := []bool{tt.filter.match(app), tt.filter.match(sandbox), tt.filter.match(bare)}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("match of app, sandbox, bare (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIsUID(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70": true,
		"6F1C2A7E-8B9D-4C3E-A1F0-2B3C4D5E6F70": true,
		"6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f7":  false,
		"6f1c2a7e_8b9d-4c3e-a1f0-2b3c4d5e6f70": false,
		"web-0-8b9d-4c3e-a1f0-2b3c4d5e6f70xxx": false,
		"aaaa-1111":                            false,
	} {
		if got := isUID(s); got != want {
			t.Errorf("isUID(%q) = %v, want %v", s, got, want)
		}
	}
}
