package consumer

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
)

func TestPartitionTransform(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		prefix string
		filter Filter
		want   jetstream.SubjectTransformConfig
	}{
		{
			name:   "without a filter every event is copied and partitioned by its pod token",
			prefix: "pleg",
			want: jetstream.SubjectTransformConfig{
				Source:      "pleg.*.*.*.*",
				Destination: "{{partition(8,3)}}.pleg.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}",
			},
		},
		{
			name:   "a node filter is a literal token and the pod is the second wildcard",
			prefix: "pleg",
			filter: Filter{Node: "node.1", Type: "pleg.v1.ContainerDied"},
			want: jetstream.SubjectTransformConfig{
				Source:      "pleg.node_1.*.*.ContainerDied",
				Destination: "{{partition(8,2)}}.pleg.node_1.{{wildcard(1)}}.{{wildcard(2)}}.ContainerDied",
			},
		},
		{
			name:   "a namespace filter is a literal token",
			prefix: "pleg",
			filter: Filter{Namespace: "shop"},
			want: jetstream.SubjectTransformConfig{
				Source:      "pleg.*.shop.*.*",
				Destination: "{{partition(8,2)}}.pleg.{{wildcard(1)}}.shop.{{wildcard(2)}}.{{wildcard(3)}}",
			},
		},
		{
			name:   "a pod filter puts everything in partition 0",
			prefix: "a.b",
			filter: Filter{PodUID: "uid-1"},
			want: jetstream.SubjectTransformConfig{
				Source:      "a.b.*.*.uid-1.*",
				Destination: "0.a.b.{{wildcard(1)}}.{{wildcard(2)}}.uid-1.{{wildcard(3)}}",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := partitionTransform(tt.prefix, tt.filter, 8)
			if err != nil {
				t.Fatalf("partitionTransform: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("partitionTransform (-want +got):\n%s", diff)
			}
		})
	}
}

// The legacy transform must be the one groups were made with before the
// namespace token, byte for byte, or their work streams would be refused.
func TestLegacyPartitionTransformIsTheOldOne(t *testing.T) {
	t.Parallel()
	tests := []struct {
		filter Filter
		want   jetstream.SubjectTransformConfig
	}{
		{want: jetstream.SubjectTransformConfig{
			Source:      "pleg.*.*.*",
			Destination: "{{partition(8,2)}}.pleg.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}",
		}},
		{filter: Filter{Node: "node.1", Type: "pleg.v1.ContainerDied"}, want: jetstream.SubjectTransformConfig{
			Source:      "pleg.node_1.*.ContainerDied",
			Destination: "{{partition(8,1)}}.pleg.node_1.{{wildcard(1)}}.ContainerDied",
		}},
		{filter: Filter{Namespace: "shop", PodUID: "uid-1"}, want: jetstream.SubjectTransformConfig{
			Source:      "pleg.*.uid-1.*",
			Destination: "0.pleg.{{wildcard(1)}}.uid-1.{{wildcard(2)}}",
		}},
	}
	for _, tt := range tests {
		got, err := legacyPartitionTransform("pleg", tt.filter, 8)
		if err != nil {
			t.Fatalf("legacyPartitionTransform(%+v): %v", tt.filter, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("legacyPartitionTransform(%+v) (-want +got):\n%s", tt.filter, diff)
		}
	}
}

func TestPartitionTransformRefusesBadInput(t *testing.T) {
	t.Parallel()
	if _, err := partitionTransform("pleg.>", Filter{}, 8); err == nil {
		t.Error("partitionTransform accepted a prefix with a wildcard")
	}
	if _, err := partitionTransform("pleg", Filter{Type: "Boom"}, 8); err == nil {
		t.Error("partitionTransform accepted an unknown type")
	}
}
