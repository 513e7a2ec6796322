package crisim

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fill sets every field of m, and an unknown field, to a value that is not
// the zero one, so that a copy that leaves a field out differs from m.
func fill(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			mp.Set(fillValue(fd.MapKey(), nil).MapKey(), fillValue(fd.MapValue(), mp.NewValue))
		case fd.IsList():
			l := m.Mutable(fd).List()
			l.Append(fillValue(fd, l.NewElement))
		default:
			m.Set(fd, fillValue(fd, func() protoreflect.Value { return m.NewField(fd) }))
		}
	}
	m.SetUnknown(protowireField())
}

// fillValue is a value of fd's kind that is not the zero one; newMessage
// makes an empty message for a message kind.
func fillValue(fd protoreflect.FieldDescriptor, newMessage func() protoreflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(7)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(7)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(7)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(7)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(7)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("x")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("x"))
	default: // a message or group
		v := newMessage()
		fill(v.Message())
		return v
	}
}

// protowireField is field 999 as a varint of 1, a field no CRI message has.
func protowireField() protoreflect.RawFields {
	return protoreflect.RawFields{0xb8, 0x3e, 0x01}
}

func TestCopiesCopyEveryField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		orig proto.Message
		copy func(proto.Message) proto.Message
	}{
		{"a container", &runtimeapi.Container{}, func(m proto.Message) proto.Message { return copyContainer(m.(*runtimeapi.Container)) }},
		{"a container status", &runtimeapi.ContainerStatus{}, func(m proto.Message) proto.Message {
			return copyContainerStatus(m.(*runtimeapi.ContainerStatus))
		}},
		{"a sandbox", &runtimeapi.PodSandbox{}, func(m proto.Message) proto.Message { return copySandbox(m.(*runtimeapi.PodSandbox)) }},
		{"a sandbox status", &runtimeapi.PodSandboxStatus{}, func(m proto.Message) proto.Message {
			return copySandboxStatus(m.(*runtimeapi.PodSandboxStatus))
		}},
	} {
		t.Run(tc.name+" keeps every field", func(t *testing.T) {
			t.Parallel()
			fill(tc.orig.ProtoReflect())
			got := tc.copy(tc.orig)
			if got == tc.orig {
				t.Fatal("the copy is the original")
			}
			if diff := cmp.Diff(tc.orig, got, protocmp.Transform()); diff != "" {
				t.Errorf("copy differs from the original (-orig +copy):\n%s", diff)
			}
		})
	}
}
