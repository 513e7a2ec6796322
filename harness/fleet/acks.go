package fleet

import (
	"math"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ackMetric is the bridges' publish→ack histogram: the time from handing
// an event to nats.go to its JetStream ack, of the attempt that was acked.
const ackMetric = "pleg_bridge_publish_ack_duration_seconds"

// ackHist is a cumulative histogram of publish→ack times: Counts[i] acks
// took at most Bounds[i] seconds, Count is every ack (the +Inf bucket).
// The bridges' histograms are merged into one per process; the harness
// subtracts two of them to get a window's.
type ackHist struct {
	Bounds []float64 `json:",omitempty"`
	Counts []uint64  `json:",omitempty"`
	Count  uint64
}

// ackHistOf gathers the ack histograms of regs and merges them. A registry
// that cannot be gathered, or whose buckets differ from the first one's,
// is left out: every bridge of a process is the same build.
func ackHistOf(regs []*prometheus.Registry) ackHist {
	var h ackHist
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() != ackMetric {
				continue
			}
			for _, m := range mf.GetMetric() {
				ph := m.GetHistogram()
				var bounds []float64
				var counts []uint64
				for _, b := range ph.GetBucket() {
					if math.IsInf(b.GetUpperBound(), +1) {
						continue
					}
					bounds = append(bounds, b.GetUpperBound())
					counts = append(counts, b.GetCumulativeCount())
				}
				h = h.plus(ackHist{Bounds: bounds, Counts: counts, Count: ph.GetSampleCount()})
			}
		}
	}
	return h
}

// plus returns h and o merged; o is left out if its buckets differ.
func (h ackHist) plus(o ackHist) ackHist {
	if h.Count == 0 && len(h.Bounds) == 0 {
		return ackHist{Bounds: slices.Clone(o.Bounds), Counts: slices.Clone(o.Counts), Count: o.Count}
	}
	if !slices.Equal(h.Bounds, o.Bounds) {
		return h
	}
	out := ackHist{Bounds: h.Bounds, Counts: slices.Clone(h.Counts), Count: h.Count + o.Count}
	for i := range out.Counts {
		out.Counts[i] += o.Counts[i]
	}
	return out
}

// since returns what was added to a process's histogram from prev to h.
// A process that was restarted in between counts from zero again: then
// h alone is what its incarnation added (what the killed one added after
// prev is lost to the figures, not to the accounting).
func (h ackHist) since(prev ackHist) ackHist {
	if h.Count < prev.Count || !slices.Equal(h.Bounds, prev.Bounds) {
		return h
	}
	out := ackHist{Bounds: h.Bounds, Counts: slices.Clone(h.Counts), Count: h.Count - prev.Count}
	for i := range out.Counts {
		out.Counts[i] -= prev.Counts[i]
	}
	return out
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linear within the bucket that holds it, the lowest bucket starting
// at 0, and the highest finite bound for what lies above it. It returns 0
// for an empty histogram.
func (h ackHist) quantile(q float64) time.Duration {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return 0
	}
	rank := q * float64(h.Count)
	lower, below := 0.0, uint64(0)
	for i, upper := range h.Bounds {
		if float64(h.Counts[i]) >= rank {
			in := h.Counts[i] - below
			frac := 1.0
			if in > 0 {
				frac = (rank - float64(below)) / float64(in)
			}
			return seconds(lower + (upper-lower)*frac)
		}
		lower, below = upper, h.Counts[i]
	}
	return seconds(h.Bounds[len(h.Bounds)-1])
}

// bucketed returns exact times counted into bounds, so that they can be
// compared with a histogram of those bounds by the same estimate.
func bucketed(bounds []float64, sorted []time.Duration) ackHist {
	h := ackHist{Bounds: bounds, Counts: make([]uint64, len(bounds)), Count: uint64(len(sorted))}
	j := 0
	for i, b := range bounds {
		for j < len(sorted) && sorted[j].Seconds() <= b {
			j++
		}
		h.Counts[i] = uint64(j)
	}
	return h
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
