package generator

import (
	"maps"
	"strings"
	"time"
)

// kubeletLabelPrefix starts the labels the kubelet adds to every sandbox
// (io.kubernetes.pod.uid and the like). They repeat the pod's identity and
// are left out of PodMeta.Labels.
const kubeletLabelPrefix = "io.kubernetes."

// PodMeta is a pod's labels and allowlisted annotations, as the pod's
// sandbox carries them. The CRI fixes them when the sandbox is created, so
// a pod's newest sandbox has the newest.
//
// A PodMeta is shared by the pod's cache record and by every event of the
// pod, and never modified once built: a node's containers hold one copy per
// pod, not one per container or event.
type PodMeta struct {
	// Labels are the sandbox's labels without the kubelet's io.kubernetes.*
	// keys; empty, not nil, for a pod without labels of its own.
	Labels map[string]string
	// Annotations are the sandbox's annotations whose keys are in
	// Options.PodAnnotations, nil when that list is empty. No other
	// annotation is kept: they can be large (kubectl's
	// last-applied-configuration holds the whole object).
	Annotations map[string]string

	// sandboxID and sandboxCreated say which sandbox the values come from
	// (empty and zero for values restored from the spool).
	sandboxID      string
	sandboxCreated time.Time
}

// Equal reports whether m and o hold the same labels and annotations,
// whichever sandbox they were read from. A nil PodMeta (nothing known)
// equals only another nil one.
func (m *PodMeta) Equal(o *PodMeta) bool {
	if m == nil || o == nil {
		return m == o
	}
	return maps.Equal(m.Labels, o.Labels) && maps.Equal(m.Annotations, o.Annotations) &&
		(m.Annotations == nil) == (o.Annotations == nil)
}

// supersedes reports whether m, just read from a sandbox, replaces o as
// the pod's metadata: nothing was known, o was restored without knowing its
// sandbox, or m comes from another sandbox created later. Between two
// sandboxes of unknown age the one known first stays, so that the pod's
// metadata does not flip with the order of a listing.
func (m *PodMeta) supersedes(o *PodMeta) bool {
	switch {
	case m == nil:
		return false
	case o == nil:
		return true
	case o.sandboxID == "":
		return m.sandboxID != ""
	}
	return m.sandboxID != o.sandboxID && m.sandboxCreated.After(o.sandboxCreated)
}

// NewPodMeta returns the PodMeta of labels and annotations that are already
// filtered, as a stored event holds them (the spool). It keeps the maps.
func NewPodMeta(labels, annotations map[string]string) *PodMeta {
	if labels == nil {
		labels = map[string]string{}
	}
	return &PodMeta{Labels: labels, Annotations: annotations}
}

// metaFilter builds PodMeta from sandboxes: the labels without the
// kubelet's keys, and the annotations named in an allowlist.
type metaFilter struct {
	annotations []string // the allowlist; a handful of keys at most
}

// sandboxMeta returns the metadata of sandbox sb of pod podUID: what known
// returns for the pod (the cache's; nil known or nil result: nothing
// known) if it was read from sb, else read from sb. The labels and
// annotations of a sandbox are fixed at its creation, and a PodMeta is
// never modified once built, so a pod's events and its cache record share
// one; reading it anew for each stream message was a tenth of what the
// bridge allocated under churn (pleg-bench's throughput rows, allocation
// profile).
func (f metaFilter) sandboxMeta(known func(podUID string) *PodMeta, podUID string, sb criSandbox, now time.Time) *PodMeta {
	if known != nil {
		if m := known(podUID); m != nil && m.sandboxID == sb.GetId() {
			return m
		}
	}
	return f.podMeta(sb, now)
}

// podMeta reads sb's metadata. now stands against an absurd created_at
// (see validTime).
func (f metaFilter) podMeta(sb criSandbox, now time.Time) *PodMeta {
	all := sb.GetLabels()
	n := 0
	for k := range all {
		if !strings.HasPrefix(k, kubeletLabelPrefix) {
			n++
		}
	}
	m := &PodMeta{
		Labels:         make(map[string]string, n),
		sandboxID:      sb.GetId(),
		sandboxCreated: validTime(sb.GetCreatedAt(), now),
	}
	for k, v := range all {
		if !strings.HasPrefix(k, kubeletLabelPrefix) {
			m.Labels[k] = v
		}
	}
	if len(f.annotations) > 0 {
		ann := sb.GetAnnotations()
		m.Annotations = make(map[string]string, len(f.annotations))
		for _, k := range f.annotations {
			if v, ok := ann[k]; ok {
				m.Annotations[k] = v
			}
		}
	}
	return m
}
