package publish_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// asyncAPIObject returns the object at path in the AsyncAPI document,
// failing t if it is missing.
func asyncAPIObject(t *testing.T, doc map[string]any, path ...string) map[string]any {
	t.Helper()
	v := doc
	for i, k := range path {
		next, ok := v[k].(map[string]any)
		if !ok {
			t.Fatalf("%s: no object %s", schemas.AsyncAPIFile, strings.Join(path[:i+1], "."))
		}
		v = next
	}
	return v
}

// TestAsyncAPIDescribesWhatPublishSends encodes an event of every
// Lifecycle type the code can publish, in both content modes, and checks
// the AsyncAPI document against the messages: each is valid for its
// documented message (headers and payload), its subject fits the channel
// address with the documented event type, and the headers the document lists
// for a mode are exactly those the encoder sets.
func TestAsyncAPIDescribesWhatPublishSends(t *testing.T) {
	t.Parallel()
	doc := schemastest.AsyncAPI(t)
	components := asyncAPIObject(t, doc, "components", "schemas")
	documented := map[publish.Mode][]string{
		publish.ModeStructured: slices.Sorted(maps.Keys(asyncAPIObject(t, components, "structuredHeaders", "properties"))),
		publish.ModeBinary:     slices.Sorted(maps.Keys(asyncAPIObject(t, components, "binaryHeaders", "properties"))),
	}
	var required []string
	for _, r := range components["binaryHeaders"].(map[string]any)["required"].([]any) {
		required = append(required, r.(string))
	}
	if diff := cmp.Diff(documented[publish.ModeBinary], slices.Sorted(slices.Values(required))); diff != "" {
		t.Errorf("binary headers listed but not required, or required but not listed (-listed +required):\n%s", diff)
	}
	var enum []string
	params := asyncAPIObject(t, doc, "channels", "lifecycleEvents", "parameters")
	for _, e := range asyncAPIObject(t, params, "eventType")["enum"].([]any) {
		enum = append(enum, e.(string))
	}

	events := goldenEvents(t)
	for _, mode := range []publish.Mode{publish.ModeStructured, publish.ModeBinary} {
		enc := newEncoder(t, publish.EncoderOptions{Mode: mode, ClusterName: "prod"})
		for _, typ := range generator.LifecycleEventTypes {
			t.Run(string(mode)+"/"+string(typ), func(t *testing.T) {
				msg := encode(t, enc, events[typ])
				msgID := string(typ) + strings.ToUpper(string(mode[:1])) + string(mode[1:])
				if err := schemastest.CheckAsyncAPIMessage(msgID, msg.Header, msg.Data); err != nil {
					t.Errorf("the encoded %s does not fit message %s: %v", typ, msgID, err)
				}
				if diff := cmp.Diff(documented[mode], slices.Sorted(maps.Keys(msg.Header))); diff != "" {
					t.Errorf("headers (-documented +sent):\n%s", diff)
				}
				// {prefix}.{node}.{namespace}.{podUID}.{eventType}
				tokens := strings.Split(msg.Subject, ".")
				if len(tokens) != 5 || tokens[0] != "pleg" || tokens[1] != schemas.EncodeToken("node-1") ||
					tokens[2] != schemas.EncodeToken(events[typ].Pod.Namespace) ||
					tokens[3] != schemas.EncodeToken(testPodUID) || tokens[4] != string(typ) {
					t.Errorf("subject %q does not fit the channel address", msg.Subject)
				}
				if !slices.Contains(enum, string(typ)) {
					t.Errorf("eventType %s is not in the documented enum %v", typ, enum)
				}
			})
		}
	}
}
