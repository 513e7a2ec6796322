package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/jsonenc"
)

// record is a Lifecycle event as the store keeps it, in the checkpoint and
// in the spool alike. Its field set and JSON names are those of the
// checkpoint files the bridge wrote before this package (checkpoint.json
// and checkpoint.journal), so that one decoder reads all three; DetectedBy
// was added for the spool, whose events are published from the record and
// must say which source found them. An older record without it decodes
// with an empty DetectedBy, which only the checkpoint holds and never
// publishes. PodLabels and PodAnnotations were added for the spool too
// (the event's Pod.Meta); the checkpoint leaves them out (see RecordAck).
type record struct {
	Type           generator.LifecycleEventType `json:"type"`
	PodUID         string                       `json:"podUID"`
	Namespace      string                       `json:"namespace,omitempty"`
	PodName        string                       `json:"podName,omitempty"`
	PodLabels      map[string]string            `json:"podLabels,omitzero"`
	PodAnnotations map[string]string            `json:"podAnnotations,omitzero"`
	ID             string                       `json:"id"`
	Name           string                       `json:"name,omitempty"`
	Attempt        uint32                       `json:"attempt,omitempty"`
	Sandbox        bool                         `json:"sandbox,omitempty"`
	Image          string                       `json:"image,omitempty"`
	ImageRef       string                       `json:"imageRef,omitempty"`
	State          generator.State              `json:"state"`
	ExitCode       *int32                       `json:"exitCode,omitempty"`
	Reason         string                       `json:"reason,omitempty"`
	Message        string                       `json:"message,omitempty"`
	StartedAt      time.Time                    `json:"startedAt,omitzero"`
	FinishedAt     time.Time                    `json:"finishedAt,omitzero"`
	Time           time.Time                    `json:"time,omitzero"`
	DetectedBy     generator.Source             `json:"detectedBy,omitempty"`
	ObservedAt     time.Time                    `json:"observedAt,omitzero"`
}

func toRecord(ev generator.Event) record {
	var labels, annotations map[string]string
	if m := ev.Pod.Meta; m != nil {
		labels, annotations = m.Labels, m.Annotations
		if labels == nil {
			labels = map[string]string{} // known to be none; nil is unknown
		}
	}
	return record{
		PodLabels: labels, PodAnnotations: annotations,
		Type: ev.Type, PodUID: ev.Pod.UID, Namespace: ev.Pod.Namespace, PodName: ev.Pod.Name,
		ID: ev.Container.ID, Name: ev.Container.Name, Attempt: ev.Container.Attempt, Sandbox: ev.Container.Sandbox,
		Image: ev.Container.Image, ImageRef: ev.Container.ImageRef, State: ev.State, ExitCode: ev.ExitCode,
		Reason: ev.Reason, Message: ev.Message, StartedAt: ev.StartedAt, FinishedAt: ev.FinishedAt,
		Time: ev.Time, DetectedBy: ev.DetectedBy, ObservedAt: ev.ObservedAt,
	}
}

func (r record) event() generator.Event {
	var meta *generator.PodMeta
	if r.PodLabels != nil {
		meta = generator.NewPodMeta(r.PodLabels, r.PodAnnotations)
	}
	return generator.Event{
		Type: r.Type, Pod: generator.Pod{UID: r.PodUID, Namespace: r.Namespace, Name: r.PodName, Meta: meta},
		Container: generator.Container{ID: r.ID, Name: r.Name, Attempt: r.Attempt, Sandbox: r.Sandbox, Image: r.Image, ImageRef: r.ImageRef},
		State:     r.State, ExitCode: r.ExitCode, Reason: r.Reason, Message: r.Message,
		StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, Time: r.Time, DetectedBy: r.DetectedBy, ObservedAt: r.ObservedAt,
	}
}

// encodeRecord returns r as stored: the JSON encoding/json writes for it,
// written by hand. Through encoding/json (reflection) it was a sixth of the
// durable state's CPU at 10,000 transitions a second (pleg-bench's
// throughput rows, CPU profile); TestEncodeRecordMatchesEncodingJSON and
// FuzzEncodeRecordMatchesEncodingJSON hold it to encoding/json byte for
// byte, so records written before and after read alike.
func encodeRecord(r record) ([]byte, error) {
	b, err := appendRecord(make([]byte, 0, recordSize(&r)), &r)
	if err != nil {
		return nil, fmt.Errorf("encode record of container %s: %w", r.ID, err)
	}
	return b, nil
}

// recordSize is room for r's JSON unless its strings need many escapes:
// the field names, punctuation and times (448 bytes), and its strings.
func recordSize(r *record) int {
	n := 448 + len(r.Type) + len(r.PodUID) + len(r.Namespace) + len(r.PodName) + len(r.ID) + len(r.Name) +
		len(r.Image) + len(r.ImageRef) + len(r.State) + len(r.Reason) + len(r.Message) + len(r.DetectedBy)
	for k, v := range r.PodLabels {
		n += len(k) + len(v) + 6
	}
	for k, v := range r.PodAnnotations {
		n += len(k) + len(v) + 6
	}
	return n
}

// appendRecord appends r's JSON, in the order of record's fields, leaving
// out what their omitempty and omitzero options leave out.
func appendRecord(b []byte, r *record) ([]byte, error) {
	b = append(b, `{"type":`...)
	b = jsonenc.AppendString(b, string(r.Type))
	b = appendField(b, "podUID", r.PodUID, false)
	b = appendField(b, "namespace", r.Namespace, true)
	b = appendField(b, "podName", r.PodName, true)
	b = appendMapField(b, "podLabels", r.PodLabels)
	b = appendMapField(b, "podAnnotations", r.PodAnnotations)
	b = appendField(b, "id", r.ID, false)
	b = appendField(b, "name", r.Name, true)
	if r.Attempt != 0 {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendUint(b, uint64(r.Attempt), 10)
	}
	if r.Sandbox {
		b = append(b, `,"sandbox":true`...)
	}
	b = appendField(b, "image", r.Image, true)
	b = appendField(b, "imageRef", r.ImageRef, true)
	b = appendField(b, "state", string(r.State), false)
	if r.ExitCode != nil {
		b = append(b, `,"exitCode":`...)
		b = strconv.AppendInt(b, int64(*r.ExitCode), 10)
	}
	b = appendField(b, "reason", r.Reason, true)
	b = appendField(b, "message", r.Message, true)
	var err error
	for _, t := range []struct {
		name string
		t    *time.Time
	}{{"startedAt", &r.StartedAt}, {"finishedAt", &r.FinishedAt}, {"time", &r.Time}} {
		if b, err = appendTimeField(b, t.name, *t.t); err != nil {
			return nil, err
		}
	}
	b = appendField(b, "detectedBy", string(r.DetectedBy), true)
	if b, err = appendTimeField(b, "observedAt", r.ObservedAt); err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// appendName appends a field's name after a comma: ,"name":
func appendName(b []byte, name string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

// appendField appends a string field, unless it is empty and omitEmpty.
func appendField(b []byte, name, v string, omitEmpty bool) []byte {
	if v == "" && omitEmpty {
		return b
	}
	return jsonenc.AppendString(appendName(b, name), v)
}

// appendMapField appends a map field unless it is nil (omitzero).
func appendMapField(b []byte, name string, m map[string]string) []byte {
	if m == nil {
		return b
	}
	return jsonenc.AppendStringMap(appendName(b, name), m)
}

// appendTimeField appends a time field unless it is zero (omitzero).
func appendTimeField(b []byte, name string, t time.Time) ([]byte, error) {
	if t.IsZero() {
		return b, nil
	}
	return jsonenc.AppendTime(appendName(b, name), t)
}

// decodeRecord decodes a stored record. A record without a container ID or
// an event type cannot be keyed, so it is corrupt.
func decodeRecord(data []byte) (record, error) {
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return r, err
	}
	if r.ID == "" || r.Type == "" {
		return r, errors.New("record without container id or event type")
	}
	return r, nil
}
