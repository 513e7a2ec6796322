package publish

import (
	"fmt"
	"strconv"
	"time"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/jsonenc"
)

// The JSON of a CloudEvent is written here by hand, straight into one
// buffer, because building an SDK event.Event, marshalling the data with
// encoding/json and then the envelope with event.WriteJson cost most of
// Encode's time and allocations. The output is the SDK's, byte for byte
// where the envelope's strings need no escapes other than json-iterator's
// (always, for Kubernetes names and IDs), and the same JSON otherwise:
// TestEncodeMatchesTheSDK and FuzzEncodeMatchesTheSDK compare the two.
//
// Every string is escaped as encoding/json escapes it (jsonenc). The SDK
// wrote the envelope's through json-iterator, which copied invalid UTF-8
// as it came, making a body that is not valid JSON text from runtime data
// that is not valid UTF-8; here it becomes U+FFFD, as in the data.
// Times differ: the envelope's time is time.RFC3339Nano as the SDK's
// types.Timestamp formats it; the data's times are written as
// time.Time.MarshalJSON writes them, which fails outside the years 0-9999.

// Sizes of the fixed text of an event, so that its buffer is allocated
// once: the JSON keys and punctuation, the numbers and times, the id, the
// CloudEvent type and the data schema URI. With every field at its longest
// they are about 400 and 320 bytes. dataSize and structuredSize add the
// variable strings; TestEncodeAllocatesItsBufferOnce checks the sum.
const (
	dataOverhead     = 448
	envelopeOverhead = 384
)

// dataSize returns at least the length of the data of ev when no string
// needs escaping; a string that does makes the buffer grow.
func (e *Encoder) dataSize(ev generator.Event) int {
	n := dataOverhead + len(e.node) + len(ev.Pod.UID) + len(ev.Pod.Namespace) + len(ev.Pod.Name) +
		len(ev.Container.ID) + len(ev.Container.Name) + len(ev.Container.Image) + len(ev.Container.ImageRef) +
		len(ev.Reason) + len(ev.Message)
	if m := ev.Pod.Meta; m != nil {
		n += mapSize(m.Labels) + mapSize(m.Annotations)
	}
	return n
}

// structuredSize returns at least the length of the structured CloudEvent of
// ev when no string needs escaping.
func (e *Encoder) structuredSize(ev generator.Event) int {
	return e.dataSize(ev) + envelopeOverhead + len(e.source) + len(e.node) + len(ev.Pod.UID) +
		len(ev.Pod.Namespace) + len(ev.Pod.Name) + 2*len(ev.Container.ID) + len(ev.Container.Name)
}

// mapSize is the length of m in JSON when nothing needs escaping.
func mapSize(m map[string]string) int {
	n := len(`{}`)
	for k, v := range m {
		n += len(`"":"",`) + len(k) + len(v)
	}
	return n
}

// appendStructured appends the structured-mode CloudEvent of ev: its
// attributes in the order event.WriteJson writes them, the data, and the
// extensions sorted by name. id is ev's CloudEvent id and info its type's;
// ev has been checked. It fails, as encoding/json does, for a data time
// whose year is outside 0-9999.
func (e *Encoder) appendStructured(b []byte, ev generator.Event, info typeInfo, id string) ([]byte, error) {
	b = append(b, `{"specversion":"1.0","id":`...)
	b = jsonenc.AppendString(b, id)
	b = append(b, `,"source":`...)
	b = jsonenc.AppendString(b, e.source)
	b = append(b, `,"type":`...)
	b = jsonenc.AppendString(b, info.ceType)
	// The subject is written in pieces, not built as ceSubject does it: the
	// envelope's escaping works byte by byte, so the result is the same.
	b = append(b, `,"subject":"`...)
	b = jsonenc.AppendEscaped(b, ev.Pod.Namespace)
	b = append(b, '/')
	b = jsonenc.AppendEscaped(b, ev.Pod.Name)
	if !ev.Container.Sandbox {
		b = append(b, '/')
		b = jsonenc.AppendEscaped(b, ev.Container.Name)
	}
	b = append(b, '"')
	b = append(b, `,"datacontenttype":"`+contentTypeJSON+`","dataschema":`...)
	b = jsonenc.AppendString(b, info.dataSchema)
	b = append(b, `,"time":"`...)
	b = eventTime(ev).UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","data":`...)
	b, err := e.appendData(b, ev)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"containerid":`...)
	b = jsonenc.AppendString(b, ev.Container.ID)
	b = append(b, `,"node":`...)
	b = jsonenc.AppendString(b, e.node)
	b = append(b, `,"poduid":`...)
	b = jsonenc.AppendString(b, ev.Pod.UID)
	return append(b, '}'), nil
}

// appendData appends the data of ev as encoding/json writes a
// schemas.EventData: its fields in declaration order, with the omitempty
// and omitzero ones left out when empty or nil. Unknown values stay out: a
// nil exit code, zero times, and the labels of a pod whose sandbox was not
// seen. TestHandWrittenDataCoversEveryField holds the fields here to the
// Go type's.
func (e *Encoder) appendData(b []byte, ev generator.Event) ([]byte, error) {
	b = append(b, `{"node":`...)
	b = jsonenc.AppendString(b, e.node)

	b = append(b, `,"pod":{"uid":`...)
	b = jsonenc.AppendString(b, ev.Pod.UID)
	if ev.Pod.Namespace != "" {
		b = append(b, `,"namespace":`...)
		b = jsonenc.AppendString(b, ev.Pod.Namespace)
	}
	if ev.Pod.Name != "" {
		b = append(b, `,"name":`...)
		b = jsonenc.AppendString(b, ev.Pod.Name)
	}
	if m := ev.Pod.Meta; m != nil {
		// Known labels are written even when there are none: {} says the
		// pod has none, where a missing key says they are not known.
		b = append(b, `,"labels":`...)
		b = jsonenc.AppendStringMap(b, m.Labels)
		if m.Annotations != nil {
			b = append(b, `,"annotations":`...)
			b = jsonenc.AppendStringMap(b, m.Annotations)
		}
	}

	b = append(b, `},"container":{"id":`...)
	b = jsonenc.AppendString(b, ev.Container.ID)
	if ev.Container.Name != "" {
		b = append(b, `,"name":`...)
		b = jsonenc.AppendString(b, ev.Container.Name)
	}
	b = append(b, `,"attempt":`...)
	b = strconv.AppendUint(b, uint64(ev.Container.Attempt), 10)
	b = append(b, `,"sandbox":`...)
	b = strconv.AppendBool(b, ev.Container.Sandbox)
	if ev.Container.Image != "" {
		b = append(b, `,"image":`...)
		b = jsonenc.AppendString(b, ev.Container.Image)
	}
	if ev.Container.ImageRef != "" {
		b = append(b, `,"imageRef":`...)
		b = jsonenc.AppendString(b, ev.Container.ImageRef)
	}

	b = append(b, `},"state":`...)
	b = jsonenc.AppendString(b, string(ev.State))
	if ev.ExitCode != nil {
		b = append(b, `,"exitCode":`...)
		b = strconv.AppendInt(b, int64(*ev.ExitCode), 10)
	}
	if ev.Reason != "" {
		b = append(b, `,"reason":`...)
		b = jsonenc.AppendString(b, ev.Reason)
	}
	if ev.Message != "" {
		b = append(b, `,"message":`...)
		b = jsonenc.AppendString(b, ev.Message)
	}
	var err error
	if !ev.StartedAt.IsZero() {
		b = append(b, `,"startedAt":`...)
		if b, err = appendDataTime(b, "startedAt", ev.StartedAt); err != nil {
			return nil, err
		}
	}
	if !ev.FinishedAt.IsZero() {
		b = append(b, `,"finishedAt":`...)
		if b, err = appendDataTime(b, "finishedAt", ev.FinishedAt); err != nil {
			return nil, err
		}
	}
	b = append(b, `,"detectedBy":`...)
	b = jsonenc.AppendString(b, string(ev.DetectedBy))
	b = append(b, `,"observedAt":`...)
	if b, err = appendDataTime(b, "observedAt", ev.ObservedAt); err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// appendDataTime appends t in UTC as time.Time.MarshalJSON writes it. Like
// it, it fails for a year outside 0-9999, which RFC 3339 cannot write.
func appendDataTime(b []byte, field string, t time.Time) ([]byte, error) {
	b, err := jsonenc.AppendTime(b, t.UTC())
	if err != nil {
		return nil, fmt.Errorf("write data %s: %w", field, err)
	}
	return b, nil
}
