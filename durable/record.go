package durable

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
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

// encodeRecord returns r as stored.
func encodeRecord(r record) ([]byte, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode record of container %s: %w", r.ID, err)
	}
	return data, nil
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
