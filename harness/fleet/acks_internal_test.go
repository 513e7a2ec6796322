package fleet

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The harness's estimate of an ack histogram's quantile is the one a
// dashboard gets from the same buckets: linear within the bucket that holds
// the rank. The histogram here is a real client_golang one, gathered.
func TestAckHistogramQuantileIsLinearWithinItsBucket(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: ackMetric, Buckets: []float64{0.001, 0.002, 0.004}})
	reg.MustRegister(h)
	// 50 acks in (0, 1ms], 40 in (1, 2ms], 10 in (2, 4ms].
	for range 50 {
		h.Observe(0.0005)
	}
	for range 40 {
		h.Observe(0.0015)
	}
	for range 10 {
		h.Observe(0.003)
	}
	got := ackHistOf([]*prometheus.Registry{reg, reg}) // two bridges alike
	if got.Count != 200 {
		t.Fatalf("merged count %d, want 200", got.Count)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, time.Millisecond},                       // rank 100 of 200: the first bucket's top
		{0.7, 1500 * time.Microsecond},                // rank 140: half into (1, 2ms]
		{0.99, 3800 * time.Microsecond},               // rank 198: 9 of 10 into (2, 4ms]
		{1, 4 * time.Millisecond},                     // the top of the highest bucket
		{0.25, 500 * time.Microsecond},                // rank 50: half of the first bucket, from 0
		{0.9, 2 * time.Millisecond},                   // rank 180: the second bucket's top
		{0.95, 2*time.Millisecond + time.Millisecond}, // rank 190: half into (2, 4ms]
	} {
		if d := got.quantile(c.q); (d - c.want).Abs() > time.Microsecond {
			t.Errorf("quantile(%v) = %v, want %v", c.q, d, c.want)
		}
	}
}

// A window's acks are what a process added since the last read; a process
// restarted in between counts from zero, so what it reports is the
// window's.
func TestAckHistogramSinceTheLastReadAndAcrossARestart(t *testing.T) {
	bounds := []float64{0.001, 0.002}
	prev := ackHist{Bounds: bounds, Counts: []uint64{10, 15}, Count: 20}
	now := ackHist{Bounds: bounds, Counts: []uint64{14, 22}, Count: 30}
	if d := now.since(prev); d.Count != 10 || d.Counts[0] != 4 || d.Counts[1] != 7 {
		t.Errorf("since: %+v, want 10 acks, 4 and 7 in the buckets", d)
	}
	restarted := ackHist{Bounds: bounds, Counts: []uint64{3, 4}, Count: 5}
	if d := restarted.since(prev); d.Count != 5 || d.Counts[0] != 3 {
		t.Errorf("since across a restart: %+v, want the new incarnation's 5 acks", d)
	}
	if prev.Counts[0] != 10 || now.Counts[0] != 14 {
		t.Error("since changed its operands")
	}
}

// Exact times put into the bridges' buckets give the same estimate as a
// histogram that observed them.
func TestBucketedExactTimesEstimateAsAHistogram(t *testing.T) {
	bounds := prometheus.ExponentialBuckets(0.00025, 2, 16)
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: ackMetric, Buckets: bounds})
	reg.MustRegister(h)
	var exact []time.Duration
	for i := 1; i <= 1000; i++ {
		d := time.Duration(i*i) * 7 * time.Nanosecond // 7ns to 7ms, skewed
		exact = append(exact, d)
		h.Observe(d.Seconds())
	}
	want := ackHistOf([]*prometheus.Registry{reg})
	got := bucketed(bounds, exact)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		if g, w := got.quantile(q), want.quantile(q); g != w {
			t.Errorf("quantile(%v): bucketed %v, histogram %v", q, g, w)
		}
	}
}
