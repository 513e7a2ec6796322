package consumer

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Content types and the header prefix of the CloudEvents NATS binding.
// contentTypeCloudEventsBare is how the binding itself names structured
// mode; pleg-bridge writes the JSON event format's full name.
const (
	contentTypeCloudEvents     = "application/cloudevents+json"
	contentTypeCloudEventsBare = "application/cloudevents"
	contentTypeJSON            = "application/json"
	binaryHeaderPrefix         = "ce-"
)

// Event is one decoded pleg-bridge CloudEvent and where it was read from.
type Event struct {
	// ID is derived from the container ID and the Lifecycle event type only,
	// so the same transition always has the same ID.
	ID     string
	Source string
	// Type is the CloudEvent type, one of schemas.TypeContainerStarted,
	// schemas.TypeContainerDied and schemas.TypeContainerRemoved.
	Type string
	// Subject is "<namespace>/<pod>/<container>", for a sandbox
	// "<namespace>/<pod>".
	Subject string
	// Time is when the transition happened by the runtime's clock, to the
	// nanosecond, in the offset the event was written with (UTC).
	Time time.Time
	// DataSchema is the URI of the data's JSON Schema, which names the
	// contract version of the bridge that wrote the event; older bridges
	// wrote it without one. schemas.ParseDataSchema reads both forms.
	DataSchema string
	// PodUID, Node and ContainerID come from the CloudEvent extensions
	// poduid, node and containerid, or from Data where an extension is
	// missing. Node is the raw node name, not the subject token.
	PodUID      string
	Node        string
	ContainerID string
	Data        schemas.EventData
	// RawData is the data exactly as received, including any keys newer
	// than schemas.EventData.
	RawData json.RawMessage

	// Sequence is the JetStream stream sequence, 0 if the event was not read
	// from a stream (Decode leaves it 0; DecodeMsg, Subscribe and Replay set
	// it).
	Sequence uint64
	// NATSSubject is the NATS subject the message was published on.
	NATSSubject string
}

// LifecycleType returns the Lifecycle event type without the CloudEvent
// type's namespace and version: "ContainerStarted", "ContainerDied" or
// "ContainerRemoved".
func (e Event) LifecycleType() string {
	return e.Type[strings.LastIndexByte(e.Type, '.')+1:]
}

// ExitCode returns the container's exit code and true, or 0 and false when
// the event carries none (a ContainerStarted, a sandbox, a container found
// gone without ever being seen exited). Data.ExitCode is a pointer so that
// an exit code of 0 and no exit code differ on the wire; printed with %v
// it shows an address, so print this instead.
func (e Event) ExitCode() (code int32, ok bool) {
	if e.Data.ExitCode == nil {
		return 0, false
	}
	return *e.Data.ExitCode, true
}

// String returns Format(e), so that printing an Event with %v or Println
// shows one readable line (with the exit code as a number) rather than the
// struct and its pointers.
func (e Event) String() string {
	return Format(e)
}

// DecodeMsg decodes a JetStream message with Decode and records its stream
// sequence.
func DecodeMsg(msg jetstream.Msg) (Event, error) {
	e, err := Decode(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		return Event{}, err
	}
	meta, err := msg.Metadata()
	if err != nil {
		return Event{}, fmt.Errorf("read message metadata: %w", err)
	}
	e.Sequence = meta.Sequence.Stream
	return e, nil
}

// Decode decodes a pleg-bridge CloudEvent published on subject, in either
// content mode of the CloudEvents NATS binding. A message whose
// Content-Type is application/cloudevents+json (or the bare
// application/cloudevents) is in structured mode: the body is the
// CloudEvent in JSON. A message with a ce-specversion header is in binary
// mode: every attribute is a ce- header (matched without regard to case,
// values unquoted and percent-decoded as the binding says) and the body is
// the data. The datacontenttype of a binary message is its
// ce-datacontenttype header; messages from bridges older than that header
// carry it in Content-Type, which is read when ce-datacontenttype is
// missing.
//
// It returns an error naming what is missing or wrong: no CloudEvent at
// all, a specversion other than 1.0, a type that is not a pleg-bridge type,
// a missing id, source, time or data, a time that is not RFC 3339, or data
// that is not the pleg-bridge event data in JSON.
func Decode(subject string, header nats.Header, body []byte) (Event, error) {
	var (
		ce  cloudEvent
		err error
	)
	contentType := headerValue(header, "Content-Type")
	switch mt := mediaType(contentType); {
	case mt == contentTypeCloudEvents || mt == contentTypeCloudEventsBare:
		ce, err = parseStructured(body)
	case headerValue(header, binaryHeaderPrefix+"specversion") != "":
		ce, err = parseBinary(header, contentType, body)
	case contentType != "":
		err = fmt.Errorf("content type %q is neither %s nor a binary-mode CloudEvent (no ce-specversion header)", contentType, contentTypeCloudEvents)
	default:
		err = errors.New("not a CloudEvent: no Content-Type " + contentTypeCloudEvents + " and no ce-specversion header")
	}
	if err != nil {
		return Event{}, fmt.Errorf("decode CloudEvent on %s: %w", subject, err)
	}
	e, err := ce.event()
	if err != nil {
		return Event{}, fmt.Errorf("decode CloudEvent on %s: %w", subject, err)
	}
	e.NATSSubject = subject
	return e, nil
}

// cloudEvent holds the attributes of a CloudEvent as strings, before
// validation, in either content mode.
type cloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	DataSchema      string          `json:"dataschema,omitempty"`
	PodUID          string          `json:"poduid,omitempty"`
	Node            string          `json:"node,omitempty"`
	ContainerID     string          `json:"containerid,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
	DataBase64      string          `json:"data_base64,omitempty"`
}

func parseStructured(body []byte) (cloudEvent, error) {
	var ce cloudEvent
	if err := json.Unmarshal(body, &ce); err != nil {
		return cloudEvent{}, fmt.Errorf("parse structured CloudEvent JSON: %w", err)
	}
	if ce.DataBase64 != "" {
		if len(ce.Data) > 0 {
			return cloudEvent{}, errors.New("both data and data_base64 are set")
		}
		data, err := base64.StdEncoding.DecodeString(ce.DataBase64)
		if err != nil {
			return cloudEvent{}, fmt.Errorf("decode data_base64: %w", err)
		}
		ce.Data, ce.DataBase64 = data, ""
	}
	return ce, nil
}

// parseBinary reads the attributes from ce- headers, decoding each value
// with decodeHeaderValue. contentType is the Content-Type header, the
// datacontenttype of binary messages published before pleg-bridge wrote
// ce-datacontenttype.
func parseBinary(h nats.Header, contentType string, body []byte) (cloudEvent, error) {
	var err error
	attr := func(name string) string {
		v, derr := decodeHeaderValue(headerValue(h, binaryHeaderPrefix+name))
		if derr != nil && err == nil {
			err = fmt.Errorf("header %s%s: %w", binaryHeaderPrefix, name, derr)
		}
		return v
	}
	ce := cloudEvent{
		SpecVersion:     attr("specversion"),
		ID:              attr("id"),
		Source:          attr("source"),
		Type:            attr("type"),
		Subject:         attr("subject"),
		Time:            attr("time"),
		DataContentType: cmp.Or(attr("datacontenttype"), contentType),
		DataSchema:      attr("dataschema"),
		PodUID:          attr("poduid"),
		Node:            attr("node"),
		ContainerID:     attr("containerid"),
		Data:            body,
	}
	return ce, err
}

// decodeHeaderValue decodes a ce- header value as the CloudEvents NATS
// binding prescribes: a double-quoted value (RFC 7230 quoted-string, written
// by older binding versions) is unquoted first, then one round of
// percent-decoding is done; the result must be valid UTF-8, so an overlong
// or truncated encoded sequence is refused. pleg-bridge itself never
// quotes: it percent-encodes spaces, '"', '%' and every byte outside
// printable ASCII.
func decodeHeaderValue(v string) (string, error) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		inner := v[1 : len(v)-1]
		for i := 0; i < len(inner); i++ {
			if inner[i] == '\\' && i+1 < len(inner) {
				i++
			}
			b.WriteByte(inner[i])
		}
		v = b.String()
	}
	if strings.Contains(v, "%") {
		u, err := url.PathUnescape(v)
		if err != nil {
			return "", err
		}
		v = u
	}
	if !utf8.ValidString(v) {
		return "", fmt.Errorf("value %q is not UTF-8 once percent-decoded", v)
	}
	return v, nil
}

// event validates the attributes and decodes the data.
func (ce cloudEvent) event() (Event, error) {
	switch {
	case ce.SpecVersion == "":
		return Event{}, errors.New("missing specversion")
	case ce.SpecVersion != "1.0":
		return Event{}, fmt.Errorf("specversion %q is not 1.0", ce.SpecVersion)
	case ce.ID == "":
		return Event{}, errors.New("missing id")
	case ce.Source == "":
		return Event{}, errors.New("missing source")
	case ce.Type == "":
		return Event{}, errors.New("missing type")
	case !isPlegType(ce.Type):
		return Event{}, fmt.Errorf("type %q is not a pleg-bridge type (%s, %s or %s)", ce.Type,
			schemas.TypeContainerStarted, schemas.TypeContainerDied, schemas.TypeContainerRemoved)
	case ce.Time == "":
		return Event{}, errors.New("missing time")
	}
	t, err := time.Parse(time.RFC3339Nano, ce.Time)
	if err != nil {
		return Event{}, fmt.Errorf("time %q is not an RFC 3339 time: %w", ce.Time, err)
	}
	if ce.DataContentType != "" && mediaType(ce.DataContentType) != contentTypeJSON {
		return Event{}, fmt.Errorf("datacontenttype %q is not %s", ce.DataContentType, contentTypeJSON)
	}
	raw := bytes.TrimSpace(ce.Data)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return Event{}, errors.New("missing data")
	}
	var data schemas.EventData
	if err := json.Unmarshal(raw, &data); err != nil {
		return Event{}, fmt.Errorf("parse data: %w", err)
	}
	e := Event{
		ID:          ce.ID,
		Source:      ce.Source,
		Type:        ce.Type,
		Subject:     ce.Subject,
		Time:        t,
		DataSchema:  ce.DataSchema,
		PodUID:      cmp.Or(ce.PodUID, data.Pod.UID),
		Node:        cmp.Or(ce.Node, data.Node),
		ContainerID: cmp.Or(ce.ContainerID, data.Container.ID),
		Data:        data,
		RawData:     json.RawMessage(bytes.Clone(raw)),
	}
	return e, nil
}

// CloudEventJSON returns the event as a structured-mode CloudEvent, JSON on
// one line, with the data as received (RawData). Attributes pleg-bridge does
// not define are not kept.
func (e Event) CloudEventJSON() ([]byte, error) {
	var data bytes.Buffer
	if err := json.Compact(&data, e.RawData); err != nil {
		return nil, fmt.Errorf("compact data of event %s: %w", e.ID, err)
	}
	ce := cloudEvent{
		SpecVersion:     "1.0",
		ID:              e.ID,
		Source:          e.Source,
		Type:            e.Type,
		Subject:         e.Subject,
		Time:            e.Time.Format(time.RFC3339Nano),
		DataContentType: contentTypeJSON,
		DataSchema:      e.DataSchema,
		PodUID:          e.PodUID,
		Node:            e.Node,
		ContainerID:     e.ContainerID,
		Data:            data.Bytes(),
	}
	b, err := json.Marshal(ce)
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", e.ID, err)
	}
	return b, nil
}

func isPlegType(t string) bool {
	switch t {
	case schemas.TypeContainerStarted, schemas.TypeContainerDied, schemas.TypeContainerRemoved:
		return true
	}
	return false
}

// headerValue returns the first value of the header key. NATS headers are
// case-sensitive, but HTTP-minded publishers write Content-Type and
// Ce-Id as readily as content-type and ce-id, so the exact key is tried
// first and then any spelling of it.
func headerValue(h nats.Header, key string) string {
	if v := h.Get(key); v != "" {
		return v
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// mediaType returns the lower-case media type of a Content-Type value
// without its parameters, or the value itself if it does not parse.
func mediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(contentType))
	}
	return mt
}
