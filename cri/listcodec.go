package cri

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// listCodec is the gRPC codec of the CRI client's two listings,
// ListPodSandbox and ListContainers, and of its event stream,
// GetContainerEvents. It decodes only what the generator reads and skips
// the rest on the wire: no container annotations, mounts or resources, of
// a container's labels only the kubelet's pod and container identity, of
// a sandbox's annotations only those in annotations
// (Options.PodAnnotations), no sandbox network or Linux status. Every
// other message is decoded as protobuf does.
//
// Why: a kubelet's objects carry about 1 KB of labels and annotations each
// (container hash, restart count, termination message path and policy,
// ports; kubectl's last-applied-configuration of a few KB on a pod), which
// the generator never reads. Decoding them into maps was half the CPU of a
// steady relist and three quarters of the bytes it allocated
// (BenchmarkListDecode, and pleg-bench's idle rows: see BENCHMARKS.md).
// A stream message carries its pod's sandbox status and every container
// status, with the same labels and annotations: decoding them was a sixth
// of the bridge's CPU at 10,000 transitions a second, and its largest
// source of garbage (BenchmarkStreamEventDecode, pleg-bench's throughput
// rows).
//
// With memos, a listing reads its items through them (see listMemo): full
// says the listing has no filter, and may replace them.
type listCodec struct {
	annotations []string // sandbox annotations kept; a handful at most
	proto       encoding.CodecV2
	memos       *listMemos
	full        bool
	// stream, for the codec of one event stream, remembers what its
	// messages repeat.
	stream *streamMemo
}

// streamMemo is what the codec of one event stream remembers between its
// messages: the strings they repeat (container and sandbox IDs, images,
// names), and the labels and annotations of their sandboxes. Every message
// of a pod carries its sandbox status and the status of each of its
// containers, and a pod's life is a dozen or more messages: decoded anew,
// the same strings and maps were most of what the stream's decoding
// allocated (BenchmarkStreamEventDecode). A stream's messages are decoded
// one at a time, by the goroutine that receives them, so it is not safe for
// concurrent use.
type streamMemo struct {
	strs *listDecoder // bounded: see streamStrings
	// sandboxes are the labels and annotations (those kept) of the
	// sandboxes the stream's messages carried, by ID, shared by every
	// message of the sandbox and never modified: the CRI fixes them at the
	// sandbox's creation. Decoding them for each message was a quarter of
	// the stream decoding's CPU and 7% of what the bridge allocated under
	// churn (pleg-bench's throughput rows, CPU and allocation profiles).
	sandboxes recentMap[sandboxMaps]
}

type sandboxMaps struct{ labels, annotations map[string]string }

// streamStrings bounds the strings a stream's codec shares: the most recent
// streamStrings to 2*streamStrings of them, about 100 bytes each. A pod's
// messages come within seconds of each other, and a node runs a few hundred
// pods of a few containers at most.
const streamStrings = 4096

// streamSandboxes bounds the sandboxes a stream's codec remembers the
// labels of, as streamStrings bounds its strings: more than a node runs
// pods, so a pod's messages find them however far apart they come.
const streamSandboxes = 1024

// strings returns the string sharer of m's stream (nil if m is nil: no
// sharing).
func (m *streamMemo) strings() *listDecoder {
	if m == nil {
		return nil
	}
	return m.strs
}

// knownSandboxes returns the sandboxes m's stream remembers (nil if m is nil).
func (m *streamMemo) knownSandboxes() *recentMap[sandboxMaps] {
	if m == nil {
		return nil
	}
	return &m.sandboxes
}

func newListCodec(annotations []string) listCodec {
	return listCodec{annotations: slices.Clone(annotations), proto: encoding.GetCodecV2("proto")}
}

// withMemos returns c reading listings through memos, full or filtered.
func (c listCodec) withMemos(memos *listMemos, full bool) listCodec {
	c.memos, c.full = memos, full
	return c
}

// forStream returns c decoding the messages of one event stream, which
// its caller receives one at a time, sharing what they repeat (see
// streamMemo).
func (c listCodec) forStream() listCodec {
	c.stream = &streamMemo{strs: &listDecoder{strs: recentMap[string]{size: streamStrings}}, sandboxes: recentMap[sandboxMaps]{size: streamSandboxes}}
	return c
}

// Name is the content-subtype of the calls: the runtime sees protobuf.
func (listCodec) Name() string { return "proto" }

func (c listCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c listCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *runtimeapi.ListContainersResponse:
		l := newListDecoder()
		return readListing(data, &m.Containers, "container", c.memos.containerListing(c.full), l.decodeContainer)
	case *runtimeapi.ListPodSandboxResponse:
		l := newListDecoder()
		return readListing(data, &m.Items, "pod sandbox", c.memos.sandboxListing(c.full),
			func(b []byte) (*runtimeapi.PodSandbox, error) { return c.decodeSandbox(l, b, listedSandboxFields, nil) })
	case *runtimeapi.ContainerEventResponse:
		// A message of a few KB, in a pooled buffer: the decoding copies
		// what it keeps.
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		if err := c.decodeEvent(buf.ReadOnlyData(), m); err != nil {
			return fmt.Errorf("decode container event: %w", err)
		}
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// decodeEvent decodes a GetContainerEvents message into m.
func (c listCodec) decodeEvent(b []byte, m *runtimeapi.ContainerEventResponse) error {
	l := c.stream.strings()
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		if typ == protowire.VarintType {
			switch num {
			case 2:
				m.ContainerEventType = runtimeapi.ContainerEventType(int32(x))
			case 3:
				m.CreatedAt = int64(x)
			}
			return nil
		}
		switch num {
		case 1:
			m.ContainerId = l.str(v)
		case 4:
			sb, err := c.decodeSandbox(l, v, sandboxStatusFields, c.stream.knownSandboxes())
			if err != nil {
				return fmt.Errorf("pod sandbox status: %w", err)
			}
			m.PodSandboxStatus = &runtimeapi.PodSandboxStatus{Id: sb.Id, Metadata: sb.Metadata, State: sb.State,
				CreatedAt: sb.CreatedAt, Labels: sb.Labels, Annotations: sb.Annotations}
		case 5:
			st, err := decodeContainerStatus(l, v)
			if err != nil {
				return fmt.Errorf("container status %d: %w", len(m.ContainersStatuses), err)
			}
			m.ContainersStatuses = append(m.ContainersStatuses, st)
		}
		return nil
	})
}

// eachItem calls fn with each item of a listing (a response whose field 1
// is a repeated message) as it reads data, one item at a time in a buffer
// it reuses: fn must copy what it keeps. A listing arrives in as many
// buffers as the transport's frames; reading it in place rather than
// copying it whole first spares a second copy of it (about 30 MB for
// 30,000 containers) at the relist's peak.
func eachItem(data mem.BufferSlice, fn func(b []byte) error) error {
	r := data.Reader()
	defer r.Close()
	var item []byte
	for r.Remaining() > 0 {
		tag, err := binary.ReadUvarint(r)
		if err != nil {
			return fmt.Errorf("read field tag: %w", err)
		}
		num, typ := protowire.DecodeTag(tag)
		var skip uint64
		switch typ {
		case protowire.BytesType:
			n, err := binary.ReadUvarint(r)
			if err != nil {
				return fmt.Errorf("read field %d length: %w", num, err)
			}
			if n > uint64(r.Remaining()) {
				return fmt.Errorf("field %d of %d bytes: %w", num, n, io.ErrUnexpectedEOF)
			}
			if num != 1 {
				skip = n
				break
			}
			item = slices.Grow(item[:0], int(n))[:n]
			if _, err := io.ReadFull(r, item); err != nil {
				return err
			}
			if err := fn(item); err != nil {
				return err
			}
		case protowire.VarintType:
			if _, err := binary.ReadUvarint(r); err != nil {
				return fmt.Errorf("read field %d: %w", num, err)
			}
		case protowire.Fixed32Type:
			skip = 4
		case protowire.Fixed64Type:
			skip = 8
		default:
			return fmt.Errorf("field %d has unsupported wire type %d", num, typ)
		}
		if skip > 0 {
			if _, err := io.CopyN(io.Discard, r, int64(skip)); err != nil {
				return fmt.Errorf("skip field %d: %w", num, err)
			}
		}
	}
	return nil
}

// eachField calls fn for each field of the message in b, in wire order,
// with a length-delimited field's payload in v or a varint field's value in
// x; fields of other wire types are skipped. It stops at fn's first error.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType || typ == protowire.VarintType {
			if err := fn(num, typ, v, x); err != nil {
				return err
			}
		}
	}
	return nil
}

// mapEntry reads a map<string, string> entry.
func mapEntry(b []byte) (key, value []byte, err error) {
	err = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ == protowire.BytesType {
			switch num {
			case 1:
				key = v
			case 2:
				value = v
			}
		}
		return nil
	})
	return key, value, err
}

// The kubelet's identity labels, which the generator reads (its
// convert.go names the same four): the only container labels the codec
// keeps.
const (
	labelPodUID        = "io.kubernetes.pod.uid"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodName       = "io.kubernetes.pod.name"
	labelContainerName = "io.kubernetes.container.name"
)

// identityLabel returns the container label k if it is one the generator
// reads (the pod's identity, for a container whose sandbox is not listed,
// and the container's name), as a constant, which spares every container
// an allocation per key; else "".
func identityLabel(k []byte) string {
	switch string(k) {
	case labelPodUID:
		return labelPodUID
	case labelPodNamespace:
		return labelPodNamespace
	case labelPodName:
		return labelPodName
	case labelContainerName:
		return labelContainerName
	}
	return ""
}

// listDecoder shares, between the items of one listing, what many of them
// repeat: the strings (a pod's sandbox ID, images, container names, label
// keys and values of a namespace or an app) and a pod's identity labels,
// one map for all its containers. Items hold the shared strings and maps
// for as long as they live, the cache the strings it keeps. At 5,000 pods
// and 20,000 containers, a listing's items held 30 MB decoded one by one,
// 18 MB so (heap profile of pleg-bench's bridge at its peak). A nil
// *listDecoder shares nothing (a stream message).
type listDecoder struct {
	// strs are the strings shared, unbounded for a listing's decoder,
	// bounded for a stream's (which lives as long as the stream).
	strs   recentMap[string]
	labels map[podLabels]map[string]string
}

func newListDecoder() *listDecoder {
	return &listDecoder{labels: make(map[podLabels]map[string]string)}
}

// str returns b as a string, the same one for every equal b.
func (l *listDecoder) str(b []byte) string {
	if l == nil {
		return string(b)
	}
	if s, ok := l.strs.get(b); ok {
		return s
	}
	s := string(b)
	l.strs.put(s, s)
	return s
}

// recentMap is a map that, given a size, keeps only what was used lately:
// once size keys were put since the last turn, those become the older
// keys and the ones before are forgotten; an older key that is asked for
// moves back. It holds size to 2*size keys. A zero size keeps every key.
// A nil *recentMap holds nothing and keeps nothing.
type recentMap[V any] struct {
	size          int
	recent, older map[string]V
}

// get returns the value of key k, if it holds one.
func (m *recentMap[V]) get(k []byte) (V, bool) {
	if m == nil {
		var zero V
		return zero, false
	}
	if v, ok := m.recent[string(k)]; ok {
		return v, true
	}
	v, ok := m.older[string(k)]
	if ok {
		m.put(string(k), v)
	}
	return v, ok
}

// put sets the value of key k.
func (m *recentMap[V]) put(k string, v V) {
	if m == nil {
		return
	}
	if m.recent == nil || m.size > 0 && len(m.recent) >= m.size {
		m.older, m.recent = m.recent, make(map[string]V, m.size)
	}
	m.recent[k] = v
}

// podLabels are the kubelet's identity labels of a listed container; an
// empty value stands for a label that is absent or empty (the generator
// reads "" either way).
type podLabels struct{ uid, namespace, name, container string }

// add reads map entry b into p if it is an identity label.
func (p *podLabels) add(l *listDecoder, b []byte) error {
	k, v, err := mapEntry(b)
	if err != nil {
		return err
	}
	switch identityLabel(k) {
	case labelPodUID:
		p.uid = l.str(v)
	case labelPodNamespace:
		p.namespace = l.str(v)
	case labelPodName:
		p.name = l.str(v)
	case labelContainerName:
		p.container = l.str(v)
	}
	return nil
}

// labelMap returns p as a label map (nil if p is empty), shared by the
// listing's containers with the same p.
func (l *listDecoder) labelMap(p podLabels) map[string]string {
	if p == (podLabels{}) {
		return nil
	}
	if m, ok := l.labels[p]; ok {
		return m
	}
	m := make(map[string]string, 4)
	for _, kv := range [...][2]string{{labelPodUID, p.uid}, {labelPodNamespace, p.namespace},
		{labelPodName, p.name}, {labelContainerName, p.container}} {
		if kv[1] != "" {
			m[kv[0]] = kv[1]
		}
	}
	l.labels[p] = m
	return m
}

// containerItem holds a listed container with its metadata and image,
// so that they take one allocation.
type containerItem struct {
	c   runtimeapi.Container
	md  runtimeapi.ContainerMetadata
	img runtimeapi.ImageSpec
}

// decodeContainer decodes a listed container. Of its labels it keeps the
// pod's identity, and the container's name only where its metadata has
// none, so that the pod's containers share one label map.
func (l *listDecoder) decodeContainer(b []byte) (*runtimeapi.Container, error) {
	x := &containerItem{}
	c := &x.c
	var labels podLabels
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x2 uint64) error {
		if typ == protowire.VarintType {
			switch num {
			case 6:
				c.State = runtimeapi.ContainerState(int32(x2))
			case 7:
				c.CreatedAt = int64(x2)
			}
			return nil
		}
		switch num {
		case 1:
			c.Id = string(v)
		case 2:
			c.PodSandboxId = l.str(v)
		case 3:
			c.Metadata = &x.md
			return decodeContainerMetadata(l, &x.md, v)
		case 4:
			c.Image = &x.img
			return decodeImageSpec(l, &x.img, v)
		case 5:
			c.ImageRef = l.str(v)
		case 8:
			return labels.add(l, v)
		}
		return nil
	})
	if c.GetMetadata().GetName() != "" {
		labels.container = ""
	}
	c.Labels = l.labelMap(labels)
	return c, err
}

// containerStatusItem holds a container status with its metadata and
// image, so that they take one allocation.
type containerStatusItem struct {
	st  runtimeapi.ContainerStatus
	md  runtimeapi.ContainerMetadata
	img runtimeapi.ImageSpec
}

// decodeContainerStatus decodes what the generator reads of a container
// status in a stream message: a listed container's fields (numbered
// differently) and its times, exit code, reason and message, sharing
// strings through l (a stream's; nil: none).
func decodeContainerStatus(l *listDecoder, b []byte) (*runtimeapi.ContainerStatus, error) {
	item := &containerStatusItem{}
	st := &item.st
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		if typ == protowire.VarintType {
			switch num {
			case 3:
				st.State = runtimeapi.ContainerState(int32(x))
			case 4:
				st.CreatedAt = int64(x)
			case 5:
				st.StartedAt = int64(x)
			case 6:
				st.FinishedAt = int64(x)
			case 7:
				st.ExitCode = int32(x)
			}
			return nil
		}
		switch num {
		case 1:
			st.Id = l.str(v)
		case 2:
			st.Metadata = &item.md
			return decodeContainerMetadata(l, st.Metadata, v)
		case 8:
			st.Image = &item.img
			return decodeImageSpec(l, st.Image, v)
		case 9:
			st.ImageRef = l.str(v)
		case 10:
			st.Reason = l.str(v)
		case 11:
			st.Message = string(v)
		case 12:
			// A stream message names its pod by the sandbox status: of a
			// container's labels only its name is read, and only where
			// its metadata has none (which comes first on the wire).
			if st.GetMetadata().GetName() != "" {
				return nil
			}
			return addIdentityLabel(&st.Labels, v)
		}
		return nil
	})
	return st, err
}

func decodeContainerMetadata(l *listDecoder, md *runtimeapi.ContainerMetadata, b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			md.Name = l.str(v)
		case num == 2 && typ == protowire.VarintType:
			md.Attempt = uint32(x)
		}
		return nil
	})
}

func decodeImageSpec(l *listDecoder, img *runtimeapi.ImageSpec, b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ == protowire.BytesType {
			switch num {
			case 1:
				img.Image = l.str(v)
			case 18:
				img.UserSpecifiedImage = l.str(v)
			}
		}
		return nil
	})
}

// addIdentityLabel adds the label of map entry b to *labels if it is one
// the generator reads (identityLabel).
func addIdentityLabel(labels *map[string]string, b []byte) error {
	k, val, err := mapEntry(b)
	key := identityLabel(k)
	if err != nil || key == "" {
		return err
	}
	if *labels == nil {
		*labels = make(map[string]string, 4)
	}
	(*labels)[key] = string(val)
	return nil
}

// sandboxFields numbers the fields of a sandbox that a listed sandbox and a
// sandbox status number differently.
type sandboxFields struct{ labels, annotations protowire.Number }

var (
	listedSandboxFields = sandboxFields{labels: 5, annotations: 6}
	sandboxStatusFields = sandboxFields{labels: 7, annotations: 8}
)

// sandboxItem holds a listed sandbox with its metadata, so that they
// take one allocation.
type sandboxItem struct {
	sb runtimeapi.PodSandbox
	md runtimeapi.PodSandboxMetadata
}

// decodeSandbox decodes a listed sandbox, or the same fields of a sandbox
// status (numbered by f; its network and Linux status are skipped), sharing
// strings through l (nil: none). A listed sandbox's ID and its pod's UID
// and name are its own, and not shared; a stream's messages (known set)
// repeat them, and share them too. With known, a sandbox whose
// labels and annotations known holds takes those, and its own are skipped
// on the wire; those of another are remembered in known.
func (c listCodec) decodeSandbox(l *listDecoder, b []byte, f sandboxFields, known *recentMap[sandboxMaps]) (*runtimeapi.PodSandbox, error) {
	x := &sandboxItem{}
	sb := &x.sb
	own := l // shares the sandbox's own strings: a stream's only
	if known == nil {
		own = nil
	}
	// remembered: the labels and annotations are known's, and the
	// message's are not read. Only before the first of them, so that a
	// message that sends its ID after them (protobuf allows any order)
	// is decoded whole.
	remembered, readMaps := false, false
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x2 uint64) error {
		if typ == protowire.VarintType {
			switch num {
			case 3:
				sb.State = runtimeapi.PodSandboxState(int32(x2))
			case 4:
				sb.CreatedAt = int64(x2)
			}
			return nil
		}
		switch num {
		case 1:
			sb.Id = own.str(v)
			if !readMaps {
				var m sandboxMaps
				m, remembered = known.get(v)
				sb.Labels, sb.Annotations = m.labels, m.annotations
			}
		case 2:
			md := &x.md
			sb.Metadata = md
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				if typ == protowire.VarintType {
					if num == 4 {
						md.Attempt = uint32(x)
					}
					return nil
				}
				switch num {
				case 1:
					md.Name = own.str(v)
				case 2:
					md.Uid = own.str(v)
				case 3:
					md.Namespace = l.str(v)
				}
				return nil
			})
		case f.labels:
			readMaps = true
			if remembered {
				return nil
			}
			k, val, err := mapEntry(v)
			if err != nil {
				return err
			}
			if sb.Labels == nil {
				sb.Labels = make(map[string]string)
			}
			key := l.str(k)
			if key == labelPodUID || key == labelPodName {
				sb.Labels[key] = string(val)
			} else {
				sb.Labels[key] = l.str(val)
			}
		case f.annotations:
			readMaps = true
			if remembered || len(c.annotations) == 0 {
				return nil
			}
			k, val, err := mapEntry(v)
			if err != nil || !slices.Contains(c.annotations, string(k)) {
				return err
			}
			if sb.Annotations == nil {
				sb.Annotations = make(map[string]string, len(c.annotations))
			}
			sb.Annotations[l.str(k)] = string(val)
		}
		return nil
	})
	if err == nil && !remembered && sb.Id != "" {
		known.put(sb.Id, sandboxMaps{sb.Labels, sb.Annotations})
	}
	return sb, err
}
