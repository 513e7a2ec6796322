package consumer_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/consumer"
)

func TestFilterSubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		filter consumer.Filter
		prefix string
		want   string
	}{
		{name: "an empty filter selects everything", prefix: "pleg", want: "pleg.>"},
		{name: "a node selects its subtree", filter: consumer.Filter{Node: "node-1"}, prefix: "pleg", want: "pleg.node-1.>"},
		{name: "a node name with dots is encoded", filter: consumer.Filter{Node: "ip-10-0-0-1.ec2.internal"}, prefix: "pleg", want: "pleg.ip-10-0-0-1_ec2_internal.>"},
		{name: "a pod selects it on any node", filter: consumer.Filter{PodUID: "6f1c2a7e-8b9d"}, prefix: "pleg", want: "pleg.*.6f1c2a7e-8b9d.>"},
		{name: "a UID with wildcards and spaces is escaped", filter: consumer.Filter{PodUID: "a*b >c"}, prefix: "pleg", want: "pleg.*.a%2Ab%20%3Ec.>"},
		{name: "a type selects it on any node and pod", filter: consumer.Filter{Type: "ContainerDied"}, prefix: "pleg", want: "pleg.*.*.ContainerDied"},
		{name: "a CloudEvent type is accepted as a type", filter: consumer.Filter{Type: "pleg.v1.ContainerRemoved"}, prefix: "pleg", want: "pleg.*.*.ContainerRemoved"},
		{name: "the short form of tail --type is accepted as a type", filter: consumer.Filter{Type: "died"}, prefix: "pleg", want: "pleg.*.*.ContainerDied"},
		{name: "a type in another case is accepted", filter: consumer.Filter{Type: "Started"}, prefix: "pleg", want: "pleg.*.*.ContainerStarted"},
		{name: "node pod and type together select one subject", filter: consumer.Filter{Node: "n", PodUID: "u", Type: "ContainerStarted"}, prefix: "pleg", want: "pleg.n.u.ContainerStarted"},
		{name: "node and type leave the pod a wildcard", filter: consumer.Filter{Node: "n", Type: "ContainerStarted"}, prefix: "pleg", want: "pleg.n.*.ContainerStarted"},
		{name: "a prefix of several tokens is kept", filter: consumer.Filter{Node: "n"}, prefix: "acme.pleg", want: "acme.pleg.n.>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.filter.Subject(tt.prefix)
			if err != nil {
				t.Fatalf("Subject(%q): %v", tt.prefix, err)
			}
			if got != tt.want {
				t.Errorf("%+v.Subject(%q) = %q, want %q", tt.filter, tt.prefix, got, tt.want)
			}
		})
	}
}

func TestFilterSubjectErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		filter  consumer.Filter
		prefix  string
		wantErr string
	}{
		{name: "an unknown type is refused", filter: consumer.Filter{Type: "ContainerChanged"}, prefix: "pleg", wantErr: `filter type "ContainerChanged"`},
		{name: "a type wildcard is refused", filter: consumer.Filter{Type: "*"}, prefix: "pleg", wantErr: `filter type "*"`},
		{name: "a short form that is no type is refused", filter: consumer.Filter{Type: "changed"}, prefix: "pleg", wantErr: `filter type "changed": want started, died or removed`},
		{name: "a prefix with a wildcard is refused", prefix: "pleg.*", wantErr: "subject prefix"},
		{name: "an empty prefix is refused", prefix: "", wantErr: "subject prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.filter.Subject(tt.prefix)
			if err == nil {
				t.Fatalf("Subject(%q) = %q, want an error", tt.prefix, got)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Subject(%q) error = %q, want it to contain %q", tt.prefix, err, tt.wantErr)
			}
		})
	}
}

func TestParseTypeTakesTheNamesOfTailType(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"died", "ContainerDied"},
		{"DIED", "ContainerDied"},
		{" started ", "ContainerStarted"},
		{"removed", "ContainerRemoved"},
		{"ContainerDied", "ContainerDied"},
		{"containerdied", "ContainerDied"},
		{"pleg.v1.ContainerRemoved", "ContainerRemoved"},
	}
	for _, tt := range tests {
		if got, err := consumer.ParseType(tt.in); err != nil || got != tt.want {
			t.Errorf("ParseType(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", "changed", "ContainerChanged", "container", "die", "pleg.v2.ContainerDied", "died,removed", "*"} {
		got, err := consumer.ParseType(in)
		if !errors.Is(err, consumer.ErrUnknownType) {
			t.Errorf("ParseType(%q) = %q, %v; want an error wrapping ErrUnknownType", in, got, err)
		}
	}
	_, err := consumer.Filter{Type: "changed"}.Subject("pleg")
	if !errors.Is(err, consumer.ErrUnknownType) {
		t.Errorf("Filter{Type: changed}.Subject: %v, want an error wrapping ErrUnknownType", err)
	}
}

// TestFiltersSelectExactlyTheirEvents publishes every combination of a few
// awkward node names, pod UIDs and types, and checks that each filter
// replays exactly the events it describes, in stream order.
func TestFiltersSelectExactlyTheirEvents(t *testing.T) {
	t.Parallel()
	_, js := newStream(t)

	nodes := []string{"node-1", "node-1.example.com", "node-1_example_com", "node-10"}
	uids := []string{"6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70", "weird uid*>", "weird.uid", "weird_uid"}
	types := []string{"ContainerStarted", "ContainerDied", "ContainerRemoved"}
	var fs []fixture
	for i, node := range nodes {
		for j, uid := range uids {
			for _, typ := range types {
				f := died()
				f.node, f.podUID, f.lifecycle = node, uid, typ
				f.containerID = fmt.Sprintf("c%d%d", i, j)
				fs = append(fs, f)
			}
		}
	}
	all := publishEvents(t, js, fs...)

	filters := []consumer.Filter{
		{},
		{Node: "node-1"},
		{Node: "node-1.example.com"},
		{Node: "node-1_example_com"},
		{PodUID: "weird uid*>"},
		{PodUID: "weird.uid"},
		{PodUID: "weird_uid"},
		{Type: "ContainerDied"},
		{Node: "node-1.example.com", PodUID: "weird.uid"},
		{Node: "node-10", Type: "ContainerRemoved"},
		{Node: "node-1", PodUID: "weird uid*>", Type: "ContainerStarted"},
		{Node: "no-such-node"},
	}
	for _, filter := range filters {
		t.Run(fmt.Sprintf("%+v", filter), func(t *testing.T) {
			t.Parallel()
			var want []consumer.Event
			for _, e := range all {
				if (filter.Node == "" || filter.Node == e.Node) &&
					(filter.PodUID == "" || filter.PodUID == e.PodUID) &&
					(filter.Type == "" || filter.Type == e.LifecycleType()) {
					want = append(want, e)
				}
			}
			got := replayAll(t, js, consumer.Options{Filter: filter, DeliverAll: true})
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Replay with filter %+v mismatch (-want +got):\n%s", filter, diff)
			}
		})
	}
}
