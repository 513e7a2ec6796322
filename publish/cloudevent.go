package publish

import (
	"crypto/sha1"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Mode is the CloudEvents content mode of the NATS protocol binding.
type Mode string

// Content modes of the CloudEvents NATS protocol binding (PLEG_CE_MODE).
const (
	// ModeStructured sends the whole CloudEvent as JSON in the body, with
	// Content-Type application/cloudevents+json. It is the default.
	ModeStructured Mode = "structured"
	// ModeBinary sends every attribute, datacontenttype included, as a ce-
	// header and the data as the body. It sets no Content-Type: in the NATS
	// binding, Content-Type only tells a structured message from a binary
	// one.
	ModeBinary Mode = "binary"
)

// Content types of the two modes.
const (
	contentTypeStructured = "application/cloudevents+json"
	contentTypeJSON       = event.ApplicationJSON
)

// eventIDNamespace is the name-based UUID namespace of CloudEvent ids. It is
// part of the contract: changing it changes every id, so a restarted bridge
// would republish what JetStream already holds.
var eventIDNamespace = uuid.MustParse("98034077-d220-46f8-924d-a5f7faabf7ca")

// EventID returns the CloudEvent id of the Lifecycle event of type t of the
// container containerID: a name-based (SHA-1) UUID of containerID + "/" + t.
// It depends on nothing else, so the same transition seen by both sources,
// or again after a restart, has the same id and JetStream stores it once.
func EventID(containerID string, t generator.LifecycleEventType) string {
	// uuid.NewSHA1 computed on the stack: it allocates a hash and a buffer
	// for every event otherwise. TestEventIDIsUUIDv5 holds the two equal.
	var buf [160]byte
	b := append(buf[:0], eventIDNamespace[:]...)
	b = append(append(append(b, containerID...), '/'), t...)
	sum := sha1.Sum(b)
	var id uuid.UUID
	copy(id[:], sum[:])
	id[6] = id[6]&0x0f | 0x50 // version 5
	id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant
	return id.String()
}

// EncoderOptions configures an Encoder.
type EncoderOptions struct {
	// Node is the node name. Required.
	Node string
	// ClusterName, when set, puts the node under /clusters/<cluster> in the
	// CloudEvent source.
	ClusterName string
	// SubjectPrefix is the first subject token, "pleg" by default in the
	// bridge's configuration. Required.
	SubjectPrefix string
	// Mode is the content mode; empty means ModeStructured.
	Mode Mode
}

// Encoder turns Lifecycle events into NATS messages carrying CloudEvents. It
// holds no mutable state and is safe for concurrent use.
type Encoder struct {
	node      string
	prefix    string
	sourceRef types.URIRef
	source    string // sourceRef as the SDK writes it
	mode      Mode
	types     map[generator.LifecycleEventType]typeInfo
}

// typeInfo holds what Encode needs for one Lifecycle event type.
type typeInfo struct {
	ceType        string
	dataSchemaRef *types.URI
	dataSchema    string // dataSchemaRef as the SDK writes it
}

// jsonContentType is the datacontenttype of every event; its address is
// shared by all of them and nothing writes through it.
var jsonContentType = contentTypeJSON

// NewEncoder checks opts and returns an Encoder. The errors name the option
// and the value at fault.
func NewEncoder(opts EncoderOptions) (*Encoder, error) {
	if opts.Node == "" {
		return nil, errors.New("create encoder: node name is empty")
	}
	if err := schemas.ValidatePrefix(opts.SubjectPrefix); err != nil {
		return nil, fmt.Errorf("create encoder: subject prefix %q: %w", opts.SubjectPrefix, err)
	}
	switch opts.Mode {
	case "":
		opts.Mode = ModeStructured
	case ModeStructured, ModeBinary:
	default:
		return nil, fmt.Errorf("create encoder: content mode %q is not %q or %q", opts.Mode, ModeStructured, ModeBinary)
	}
	source := Source(opts.ClusterName, opts.Node)
	sourceRef := types.ParseURIRef(source)
	if sourceRef == nil {
		return nil, fmt.Errorf("create encoder: source %q made of node %q and cluster %q is not a URI reference", source, opts.Node, opts.ClusterName)
	}
	e := &Encoder{
		node:      opts.Node,
		sourceRef: *sourceRef,
		source:    sourceRef.String(),
		prefix:    opts.SubjectPrefix,
		mode:      opts.Mode,
		types:     make(map[generator.LifecycleEventType]typeInfo, len(generator.LifecycleEventTypes)),
	}
	for _, t := range generator.LifecycleEventTypes {
		ceType := CloudEventType(t)
		schema, ok := schemas.DataSchema(ceType)
		if !ok {
			return nil, fmt.Errorf("create encoder: no data schema for CloudEvent type %q", ceType)
		}
		ref := types.ParseURI(schema)
		if ref == nil {
			return nil, fmt.Errorf("create encoder: data schema %q of CloudEvent type %q is not a URI", schema, ceType)
		}
		e.types[t] = typeInfo{ceType: ceType, dataSchemaRef: ref, dataSchema: ref.String()}
	}
	return e, nil
}

// Source returns the CloudEvent source of the events of node: /nodes/<node>,
// or /clusters/<cluster>/nodes/<node> when cluster is set. Each name is
// percent-escaped where it holds a character not allowed in a URI path
// segment.
func Source(cluster, node string) string {
	if cluster == "" {
		return "/nodes/" + url.PathEscape(node)
	}
	return "/clusters/" + url.PathEscape(cluster) + "/nodes/" + url.PathEscape(node)
}

// CloudEventType returns the versioned CloudEvent type of a Lifecycle event
// type, or "" for a type that is not published.
func CloudEventType(t generator.LifecycleEventType) string {
	switch t {
	case generator.ContainerStarted:
		return schemas.TypeContainerStarted
	case generator.ContainerDied:
		return schemas.TypeContainerDied
	case generator.ContainerRemoved:
		return schemas.TypeContainerRemoved
	}
	return ""
}

// nodeSubjects returns the subject filter of every event of the Encoder's
// node: <prefix>.<node>.>, in both subject layouts (the legacy one, without
// the namespace token, included).
func (e *Encoder) nodeSubjects() string {
	return e.prefix + "." + schemas.EncodeToken(e.node) + ".>"
}

// Encode returns the NATS message of ev: its subject
// <prefix>.<node>.<namespace>.<podUID>.<eventType> (tokens encoded by schemas.EncodeToken), the
// Nats-Msg-Id header set to the CloudEvent id, and the CloudEvent in the
// Encoder's content mode. It fails for an event of an unknown type, without
// a container ID or pod UID, or without any time, and for a time of the data
// outside the years 0-9999; such an event cannot be published correctly.
func (e *Encoder) Encode(ev generator.Event) (*nats.Msg, error) {
	info, err := e.check(ev)
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: schemas.Subject(e.prefix, e.node, ev.Pod.Namespace, ev.Pod.UID, string(ev.Type))}
	id := EventID(ev.Container.ID, ev.Type)
	switch e.mode {
	case ModeBinary:
		ce := e.cloudEvent(ev, info, id)
		data, err := e.appendData(make([]byte, 0, e.dataSize(ev)), ev)
		if err != nil {
			return nil, fmt.Errorf("encode event %s of container %s: %w", ev.Type, ev.Container.ID, err)
		}
		msg.Header = binaryHeaders(&ce)
		msg.Data = data
	default:
		body, err := e.structured(ev, info, id)
		if err != nil {
			return nil, err
		}
		msg.Header = nats.Header{
			jetstream.MsgIDHeader: {id},
			"Content-Type":        {contentTypeStructured},
		}
		msg.Data = body
	}
	return msg, nil
}

// EncodeStructured returns ev as a structured-mode CloudEvent, the JSON
// that Encode puts in the body in ModeStructured, whatever the Encoder's
// mode: what a store of whole events (the state bucket) holds. It fails
// for the events Encode fails for.
func (e *Encoder) EncodeStructured(ev generator.Event) ([]byte, error) {
	info, err := e.check(ev)
	if err != nil {
		return nil, err
	}
	return e.structured(ev, info, EventID(ev.Container.ID, ev.Type))
}

// Node returns the node whose events the Encoder encodes: the node token
// of their subjects, and their node extension.
func (e *Encoder) Node() string {
	return e.node
}

// structured returns the structured-mode body of ev, which check accepted;
// id is ev's CloudEvent id and info its type's.
func (e *Encoder) structured(ev generator.Event, info typeInfo, id string) ([]byte, error) {
	body, err := e.appendStructured(make([]byte, 0, e.structuredSize(ev)), ev, info, id)
	if err != nil {
		return nil, fmt.Errorf("encode event %s of container %s: %w", ev.Type, ev.Container.ID, err)
	}
	return body, nil
}

// check returns what Encode needs of ev's type, or an error if ev cannot be
// published correctly.
func (e *Encoder) check(ev generator.Event) (typeInfo, error) {
	info, ok := e.types[ev.Type]
	switch {
	case !ok:
		return typeInfo{}, fmt.Errorf("encode event of container %s: unknown Lifecycle event type %q", ev.Container.ID, ev.Type)
	case ev.Container.ID == "":
		return typeInfo{}, fmt.Errorf("encode event %s of pod %s: container ID is empty", ev.Type, ev.Pod.UID)
	case ev.Pod.UID == "":
		return typeInfo{}, fmt.Errorf("encode event %s of container %s: pod UID is empty", ev.Type, ev.Container.ID)
	case ev.ObservedAt.IsZero():
		return typeInfo{}, fmt.Errorf("encode event %s of container %s: observed time is zero", ev.Type, ev.Container.ID)
	}
	return info, nil
}

// cloudEvent returns the attributes of ev, which check accepted, as an SDK
// CloudEvent without data, for the headers of binary mode. id is ev's
// CloudEvent id and info its type's.
func (e *Encoder) cloudEvent(ev generator.Event, info typeInfo, id string) event.Event {
	// The context is built directly rather than through the setters, which
	// re-parse the source and schema URIs and re-check every value on each
	// event. Everything here is known valid: the URIs were parsed once by
	// NewEncoder, the IDs and names checked by check, and the extensions'
	// names are fixed. TestEncodeMatchesTheSDKSetters holds it to what the
	// setters and Validate produce.
	subject := ceSubject(ev)
	return event.Event{Context: &event.EventContextV1{
		ID:              id,
		Source:          e.sourceRef,
		Type:            info.ceType,
		DataContentType: &jsonContentType,
		Subject:         &subject,
		Time:            &types.Timestamp{Time: eventTime(ev).UTC()},
		DataSchema:      info.dataSchemaRef, // shared, never written
		Extensions: map[string]any{
			"poduid":      ev.Pod.UID,
			"node":        e.node,
			"containerid": ev.Container.ID,
		},
	}}
}

// eventTime is the CloudEvent time of ev: when it happened by the runtime,
// or when it was observed where the runtime gives no time.
func eventTime(ev generator.Event) time.Time {
	if ev.Time.IsZero() {
		return ev.ObservedAt
	}
	return ev.Time
}

// ceSubject is <namespace>/<pod>/<container>, or <namespace>/<pod> for a
// sandbox.
func ceSubject(ev generator.Event) string {
	if ev.Container.Sandbox {
		return ev.Pod.Namespace + "/" + ev.Pod.Name
	}
	return ev.Pod.Namespace + "/" + ev.Pod.Name + "/" + ev.Container.Name
}

// binaryHeaders returns the headers of ce in binary content mode: a ce-
// header for every attribute and extension, and Nats-Msg-Id.
//
// The CloudEvents NATS binding (1.0.3) maps every attribute to ce-<name>,
// datacontenttype included; unlike the HTTP binding it does not use
// Content-Type for it. A receiver takes a Content-Type starting with
// application/cloudevents as structured mode and anything else, no
// Content-Type included, as binary, so none is set here.
func binaryHeaders(ce *event.Event) nats.Header {
	h := nats.Header{
		jetstream.MsgIDHeader: {ce.ID()},
		"ce-specversion":      {ce.SpecVersion()},
		"ce-id":               {headerValue(ce.ID())},
		"ce-source":           {headerValue(ce.Source())},
		"ce-type":             {headerValue(ce.Type())},
		"ce-subject":          {headerValue(ce.Subject())},
		"ce-time":             {types.FormatTime(ce.Time())},
		"ce-datacontenttype":  {headerValue(ce.DataContentType())},
		"ce-dataschema":       {headerValue(ce.DataSchema())},
	}
	for name, v := range ce.Extensions() {
		s, err := types.Format(v)
		if err != nil {
			// Extensions were validated when set; a value that cannot be
			// formatted is not one of ours.
			continue
		}
		h["ce-"+name] = []string{headerValue(s)}
	}
	return h
}

// headerValue percent-encodes what a header value must not carry raw, as the
// CloudEvents HTTP binding does: space, '"', '%', and every byte outside
// printable ASCII. Kubernetes names never need it; runtime data is input,
// and a newline in a header would corrupt the message.
func headerValue(s string) string {
	if !needsHeaderEscape(s) {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if headerByteOK(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0x0f])
	}
	return b.String()
}

func needsHeaderEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		if !headerByteOK(s[i]) {
			return true
		}
	}
	return false
}

func headerByteOK(c byte) bool {
	return c > ' ' && c <= '~' && c != '"' && c != '%'
}
