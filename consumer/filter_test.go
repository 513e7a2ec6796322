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
		{name: "a namespace selects it on every node", filter: consumer.Filter{Namespace: "shop"}, prefix: "pleg", want: "pleg.*.shop.>"},
		{name: "a pod selects it on any node", filter: consumer.Filter{PodUID: "6f1c2a7e-8b9d"}, prefix: "pleg", want: "pleg.*.*.6f1c2a7e-8b9d.>"},
		{name: "a UID with wildcards and spaces is escaped", filter: consumer.Filter{PodUID: "a*b >c"}, prefix: "pleg", want: "pleg.*.*.a%2Ab%20%3Ec.>"},
		{name: "a type selects it on any node and pod", filter: consumer.Filter{Type: "ContainerDied"}, prefix: "pleg", want: "pleg.*.*.*.ContainerDied"},
		{name: "a CloudEvent type is accepted as a type", filter: consumer.Filter{Type: "pleg.v1.ContainerRemoved"}, prefix: "pleg", want: "pleg.*.*.*.ContainerRemoved"},
		{name: "the short form of tail --type is accepted as a type", filter: consumer.Filter{Type: "died"}, prefix: "pleg", want: "pleg.*.*.*.ContainerDied"},
		{name: "a type in another case is accepted", filter: consumer.Filter{Type: "Started"}, prefix: "pleg", want: "pleg.*.*.*.ContainerStarted"},
		{name: "every token together selects one subject", filter: consumer.Filter{Node: "n", Namespace: "ns", PodUID: "u", Type: "ContainerStarted"}, prefix: "pleg", want: "pleg.n.ns.u.ContainerStarted"},
		{name: "a namespace and a type leave node and pod wildcards", filter: consumer.Filter{Namespace: "shop", Type: "died"}, prefix: "pleg", want: "pleg.*.shop.*.ContainerDied"},
		{name: "a pod name is not in the subject", filter: consumer.Filter{Namespace: "shop", PodName: "web-0"}, prefix: "pleg", want: "pleg.*.shop.>"},
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
		t.Run(tt.name+", legacy", func(t *testing.T) {
			t.Parallel()
			got, err := tt.filter.LegacySubject(tt.prefix)
			if err == nil {
				t.Fatalf("LegacySubject(%q) = %q, want an error", tt.prefix, got)
			}
		})
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

func TestFilterLegacySubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		filter consumer.Filter
		want   string
	}{
		{name: "everything is one subject for both layouts", want: ""},
		{name: "a node is one subject for both layouts", filter: consumer.Filter{Node: "node-1"}, want: ""},
		{name: "a namespace cannot be selected in the legacy layout", filter: consumer.Filter{Namespace: "shop"}, want: "pleg.*.*.*"},
		{name: "a pod", filter: consumer.Filter{Namespace: "shop", PodUID: "u1"}, want: "pleg.*.u1.*"},
		{name: "a node and a type", filter: consumer.Filter{Node: "n.1", Type: "died"}, want: "pleg.n_1.*.ContainerDied"},
	}
	for _, tt := range tests {
		got, err := tt.filter.LegacySubject("pleg")
		if err != nil || got != tt.want {
			t.Errorf("%s: %+v.LegacySubject(pleg) = %q, %v; want %q", tt.name, tt.filter, got, err, tt.want)
		}
	}
}

func TestFilterMatches(t *testing.T) {
	t.Parallel()
	e := consumer.Event{Node: "node-1", PodUID: "u1", Type: "pleg.v1.ContainerDied"}
	e.Data.Pod.Namespace, e.Data.Pod.Name = "shop", "web-0"
	e.Data.Pod.Labels = map[string]string{"app": "web", "tier": "front"}
	code := int32(137)
	e.Data.ExitCode = &code
	sel := func(s string) consumer.Selector {
		t.Helper()
		sel, err := consumer.ParseSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return sel
	}
	for _, f := range []consumer.Filter{
		{}, {Node: "node-1"}, {Namespace: "shop"}, {PodUID: "u1"}, {Namespace: "shop", PodName: "web-0"}, {Type: "died"},
		{Node: "node-1", Namespace: "shop", PodUID: "u1", PodName: "web-0", Type: "ContainerDied"},
		{Selector: sel("app=web,tier!=db")}, {Failed: true}, {Namespace: "shop", Selector: sel("app in (web,api)"), Failed: true},
	} {
		if !f.Matches(e) {
			t.Errorf("%+v.Matches(%s in shop/web-0 on node-1) = false, want true", f, e.Type)
		}
	}
	for _, f := range []consumer.Filter{
		{Node: "node-2"}, {Namespace: "payments"}, {PodUID: "u2"}, {Namespace: "shop", PodName: "web-1"}, {Type: "started"},
		{Selector: sel("app=api")}, {Selector: sel("!tier")},
	} {
		if f.Matches(e) {
			t.Errorf("%+v.Matches(%s in shop/web-0 on node-1) = true, want false", f, e.Type)
		}
	}
}

func TestFilterRefusesAnInvalidNamespace(t *testing.T) {
	t.Parallel()
	err := consumer.Replay(t.Context(), nil, consumer.Options{Filter: consumer.Filter{Namespace: "Shop_1"}}, func(consumer.Event) error { return nil })
	if err == nil || !strings.Contains(err.Error(), `"Shop_1"`) {
		t.Errorf("Replay with namespace Shop_1: error %v, want one naming the namespace", err)
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
