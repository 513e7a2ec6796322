package bridge_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// TestPublishedEventsCarryPodLabelsAndOnlyAllowlistedAnnotations runs the
// whole pipeline, the simulated runtime over CRI gRPC to JetStream, in both
// content modes: the sandbox's labels reach every event's data without the
// kubelet's io.kubernetes.* keys, and of its annotations only the one
// PLEG_POD_ANNOTATIONS names. Every message passes the schema.
func TestPublishedEventsCarryPodLabelsAndOnlyAllowlistedAnnotations(t *testing.T) {
	t.Parallel()
	for _, mode := range []publish.Mode{publish.ModeStructured, publish.ModeBinary} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t)
			sb, err := n.model.RunPodSandbox(crisim.PodConfig{Name: "web-0", Namespace: "shop", UID: "uid-1",
				Labels: map[string]string{"app": "web", "pod-template-hash": "5d8f"},
				Annotations: map[string]string{
					"example.com/team": "payments",
					"kubectl.kubernetes.io/last-applied-configuration": `{"kind":"Pod"}`,
				}})
			if err != nil {
				t.Fatal(err)
			}
			n.startContainer(t, sb, "app")

			opts := testOptions(n.endpoint, n.url, t.TempDir())
			opts.CEMode = mode
			opts.PodAnnotations = []string{"example.com/team", "example.com/absent"}
			runBridge(t, opts)

			publishtest.WaitStream(t, n.js, "PLEG")
			cons, err := n.js.OrderedConsumer(t.Context(), "PLEG", jetstream.OrderedConsumerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			for range 2 { // the sandbox's and the container's ContainerStarted
				msg, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
				if err != nil {
					t.Fatal(err)
				}
				e, err := consumer.DecodeMsg(msg)
				if err != nil {
					t.Fatal(err)
				}
				if mode == publish.ModeStructured {
					schemastest.ValidateCloudEvent(t, msg.Data())
				} else {
					schemastest.Validate(t, e.Type, msg.Data())
				}
				if diff := cmp.Diff(map[string]string{"app": "web", "pod-template-hash": "5d8f"}, e.Data.Pod.Labels); diff != "" {
					t.Errorf("%s %s: pod.labels (-want +got):\n%s", e.Type, e.Subject, diff)
				}
				if diff := cmp.Diff(map[string]string{"example.com/team": "payments"}, e.Data.Pod.Annotations); diff != "" {
					t.Errorf("%s %s: pod.annotations (-want +got):\n%s", e.Type, e.Subject, diff)
				}
			}
		})
	}
}
