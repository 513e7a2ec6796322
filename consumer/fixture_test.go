package consumer_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// fixture describes one pleg-bridge event and builds it as a message in
// either content mode, and as the Event Decode should make of it.
type fixture struct {
	lifecycle   string // "ContainerStarted", "ContainerDied", "ContainerRemoved"
	node        string
	podUID      string
	namespace   string
	pod         string
	container   string
	containerID string
	sandbox     bool
	attempt     uint32
	legacy      bool // published on the subject layout without the namespace token
	exitCode    *int32
	reason      string
	state       string
	time        time.Time
}

var fixtureTime = time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)

func exitCode(c int32) *int32 { return &c }

func (f fixture) ceType() string { return "pleg.v1." + f.lifecycle }

func (f fixture) id() string { return f.containerID + "/" + f.lifecycle }

func (f fixture) subject(prefix string) string {
	if f.legacy {
		return schemas.LegacySubject(prefix, f.node, f.podUID, f.lifecycle)
	}
	return schemas.Subject(prefix, f.node, f.namespace, f.podUID, f.lifecycle)
}

func (f fixture) ceSubject() string {
	if f.sandbox {
		return f.namespace + "/" + f.pod
	}
	return f.namespace + "/" + f.pod + "/" + f.container
}

func (f fixture) data() schemas.EventData {
	state := f.state
	if state == "" {
		state = map[string]string{"ContainerStarted": "running", "ContainerDied": "exited", "ContainerRemoved": "removed"}[f.lifecycle]
	}
	return schemas.EventData{
		Node:       f.node,
		Pod:        schemas.Pod{UID: f.podUID, Namespace: f.namespace, Name: f.pod},
		Container:  schemas.Container{ID: f.containerID, Name: f.container, Attempt: f.attempt, Sandbox: f.sandbox, Image: "registry.example/app:1.2"},
		State:      state,
		ExitCode:   f.exitCode,
		Reason:     f.reason,
		DetectedBy: "relist",
		ObservedAt: f.time.Add(100 * time.Millisecond),
	}
}

func (f fixture) dataJSON(t testing.TB) []byte {
	t.Helper()
	b, err := json.Marshal(f.data())
	if err != nil {
		t.Fatalf("marshal data: %v", err)
	}
	return b
}

// dataSchema is the event's dataschema; a legacy event's is that of the
// bridges before contract versions, which had no contract segment.
func (f fixture) dataSchema() string {
	uri, _ := schemas.DataSchema(f.ceType())
	if f.legacy {
		return strings.Replace(uri, "/contract/"+schemas.ContractVersion+"/", "/", 1)
	}
	return uri
}

// structured returns the message in structured content mode.
func (f fixture) structured(t testing.TB) (nats.Header, []byte) {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"specversion":     "1.0",
		"id":              f.id(),
		"source":          "/nodes/" + f.node,
		"type":            f.ceType(),
		"subject":         f.ceSubject(),
		"time":            f.time.Format(time.RFC3339Nano),
		"datacontenttype": "application/json",
		"dataschema":      f.dataSchema(),
		"poduid":          f.podUID,
		"node":            f.node,
		"containerid":     f.containerID,
		"data":            json.RawMessage(f.dataJSON(t)),
	})
	if err != nil {
		t.Fatalf("marshal CloudEvent: %v", err)
	}
	return nats.Header{"Content-Type": {"application/cloudevents+json"}}, body
}

// binary returns the message in binary content mode as the CloudEvents NATS
// binding writes it: every attribute a ce- header, datacontenttype
// included, no Content-Type, values percent-encoded.
func (f fixture) binary(t testing.TB) (nats.Header, []byte) {
	t.Helper()
	h := nats.Header{
		"ce-specversion":     {"1.0"},
		"ce-id":              {f.id()},
		"ce-source":          {"/nodes/" + f.node},
		"ce-type":            {f.ceType()},
		"ce-subject":         {f.ceSubject()},
		"ce-time":            {f.time.Format(time.RFC3339Nano)},
		"ce-datacontenttype": {"application/json"},
		"ce-dataschema":      {f.dataSchema()},
		"ce-poduid":          {f.podUID},
		"ce-node":            {f.node},
		"ce-containerid":     {f.containerID},
	}
	for k, v := range h {
		h[k] = []string{escapeHeader(v[0])}
	}
	return h, f.dataJSON(t)
}

// escapeHeader percent-encodes space, '"', '%' and bytes outside printable
// ASCII.
func escapeHeader(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c > ' ' && c <= '~' && c != '"' && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// event returns what Decode makes of the message published on subject.
func (f fixture) event(t testing.TB, subject string) consumer.Event {
	t.Helper()
	return consumer.Event{
		ID:          f.id(),
		Source:      "/nodes/" + f.node,
		Type:        f.ceType(),
		Subject:     f.ceSubject(),
		Time:        f.time,
		DataSchema:  f.dataSchema(),
		PodUID:      f.podUID,
		Node:        f.node,
		ContainerID: f.containerID,
		Data:        f.data(),
		RawData:     f.dataJSON(t),
		NATSSubject: subject,
	}
}

// died is a ContainerDied of app in default/web-0 on node-1.
func died() fixture {
	return fixture{
		lifecycle:   "ContainerDied",
		node:        "node-1",
		podUID:      "6f1c2a7e-8b9d-4c3e-a1f0-2b3c4d5e6f70",
		namespace:   "default",
		pod:         "web-0",
		container:   "app",
		containerID: "3b9f0d2c5e7a",
		exitCode:    exitCode(137),
		reason:      "OOMKilled",
		time:        fixtureTime,
	}
}

// newStream starts an in-process JetStream server with the pleg-bridge
// stream (prefix "pleg") and returns a JetStream handle and the connection.
func newStream(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	_, url := publishtest.NewServer(t)
	nc, js := publishtest.Connect(t, url)
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{SubjectPrefix: "pleg"}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	return nc, js
}

// publishEvents publishes the fixtures in order, alternating structured and
// binary mode, and returns the events Decode should make of them with their
// stream sequences.
func publishEvents(t *testing.T, js jetstream.JetStream, fs ...fixture) []consumer.Event {
	t.Helper()
	var events []consumer.Event
	for i, f := range fs {
		h, body := f.structured(t)
		if i%2 == 1 {
			h, body = f.binary(t)
		}
		subject := f.subject("pleg")
		ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: subject, Header: h, Data: body})
		if err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
		e := f.event(t, subject)
		e.Sequence = ack.Sequence
		events = append(events, e)
	}
	return events
}

// publishRaw publishes a message that is not a pleg-bridge event.
func publishRaw(t *testing.T, js jetstream.JetStream, subject string, body string) {
	t.Helper()
	if _, err := js.Publish(t.Context(), subject, []byte(body)); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// collect returns a function for Subscribe and Replay that appends to *got.
func collect(got *[]consumer.Event) func(consumer.Event) error {
	return func(e consumer.Event) error {
		*got = append(*got, e)
		return nil
	}
}

// replayAll replays with opts and returns what was delivered.
func replayAll(t *testing.T, js jetstream.JetStream, opts consumer.Options) []consumer.Event {
	t.Helper()
	var got []consumer.Event
	if err := consumer.Replay(t.Context(), js, opts, collect(&got)); err != nil {
		t.Fatalf("Replay(%+v): %v", opts, err)
	}
	return got
}
