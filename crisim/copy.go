package crisim

import (
	"google.golang.org/protobuf/reflect/protoreflect"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Shallow copies of the stored protos. An operation that changes a stored
// sandbox or container replaces its protos with a shallow copy changed at
// the top level (a state, a timestamp, an exit code) and shares the rest
// (metadata, image, labels, annotations), which never change once stored
// (see Runtime). proto.Clone would copy the maps too: with the kubelet's
// annotations, a container's are about 1 KB. TestCopiesCopyEveryField
// catches a field that a newer CRI API adds and these leave out.

func copyContainer(c *runtimeapi.Container) *runtimeapi.Container {
	out := &runtimeapi.Container{
		Id:           c.Id,
		PodSandboxId: c.PodSandboxId,
		Metadata:     c.Metadata,
		Image:        c.Image,
		ImageRef:     c.ImageRef,
		State:        c.State,
		CreatedAt:    c.CreatedAt,
		Labels:       c.Labels,
		Annotations:  c.Annotations,
		ImageId:      c.ImageId,
	}
	copyUnknown(out, c)
	return out
}

func copyContainerStatus(st *runtimeapi.ContainerStatus) *runtimeapi.ContainerStatus {
	out := &runtimeapi.ContainerStatus{
		Id:          st.Id,
		Metadata:    st.Metadata,
		State:       st.State,
		CreatedAt:   st.CreatedAt,
		StartedAt:   st.StartedAt,
		FinishedAt:  st.FinishedAt,
		ExitCode:    st.ExitCode,
		Image:       st.Image,
		ImageRef:    st.ImageRef,
		Reason:      st.Reason,
		Message:     st.Message,
		Labels:      st.Labels,
		Annotations: st.Annotations,
		Mounts:      st.Mounts,
		LogPath:     st.LogPath,
		Resources:   st.Resources,
		ImageId:     st.ImageId,
		User:        st.User,
		StopSignal:  st.StopSignal,
	}
	copyUnknown(out, st)
	return out
}

func copySandbox(sb *runtimeapi.PodSandbox) *runtimeapi.PodSandbox {
	out := &runtimeapi.PodSandbox{
		Id:             sb.Id,
		Metadata:       sb.Metadata,
		State:          sb.State,
		CreatedAt:      sb.CreatedAt,
		Labels:         sb.Labels,
		Annotations:    sb.Annotations,
		RuntimeHandler: sb.RuntimeHandler,
	}
	copyUnknown(out, sb)
	return out
}

func copySandboxStatus(st *runtimeapi.PodSandboxStatus) *runtimeapi.PodSandboxStatus {
	out := &runtimeapi.PodSandboxStatus{
		Id:             st.Id,
		Metadata:       st.Metadata,
		State:          st.State,
		CreatedAt:      st.CreatedAt,
		Network:        st.Network,
		Linux:          st.Linux,
		Labels:         st.Labels,
		Annotations:    st.Annotations,
		RuntimeHandler: st.RuntimeHandler,
	}
	copyUnknown(out, st)
	return out
}

// copyUnknown gives dst a copy of src's unknown fields, which only injected
// data can have.
func copyUnknown(dst, src protoreflect.ProtoMessage) {
	if u := src.ProtoReflect().GetUnknown(); len(u) > 0 {
		dst.ProtoReflect().SetUnknown(append(protoreflect.RawFields(nil), u...))
	}
}
