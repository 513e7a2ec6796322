package publish

import "testing"

// TestWatermarkStaysBelowEveryMessageThatMayBeStoredUnacked walks the
// watermark through acks that come back out of order: a publish whose ack
// was lost is retried after later messages were acked, so the highest
// ack's sequence would vouch for a message that is not acked.
func TestWatermarkStaysBelowEveryMessageThatMayBeStoredUnacked(t *testing.T) {
	var w watermark
	check := func(step string, want uint64) {
		t.Helper()
		if got := w.value(); got != want {
			t.Errorf("%s: watermark %d, want %d", step, got, want)
		}
	}
	check("nothing sent", 0)

	a := w.sent() // stored at 1, its ack lost
	b := w.sent() // stored at 2
	w.stored(2)
	w.settled(b)
	check("b acked, a not: a may be stored anywhere after 0", 0)

	c := w.sent() // sent knowing of 2: stored after it, at 3
	w.stored(3)
	w.settled(c)
	check("c acked too", 0)

	w.stored(1) // a's retry: a duplicate, acked with the sequence of its first store
	w.settled(a)
	check("a acked at last", 3)

	d := w.sent() // sent knowing of 3
	e := w.sent()
	w.stored(5)
	w.settled(e)
	check("d in flight since 3", 3)
	w.settled(d) // proved not stored (no responders)
	check("d settled", 5)

	w.holding, w.holdAt = true, 4
	check("held by what the read found", 4)
	f := w.sent()
	check("held, and f in flight since 5", 4)
	w.holding = false
	check("f in flight since 5", 5)
	w.stored(6)
	w.settled(f)
	check("f acked", 6)
	if len(w.marks) != 0 {
		t.Errorf("%d marks left with nothing in flight", len(w.marks))
	}
}

// TestWatermarkForgetsSettledMarksBehindALiveOne: marks settled behind an
// older live one wait for it, and all go when it does.
func TestWatermarkForgetsSettledMarksBehindALiveOne(t *testing.T) {
	var w watermark
	old := w.sent()
	var later []*sendMark
	for i := range 100 {
		w.stored(uint64(i + 1))
		later = append(later, w.sent())
	}
	for _, m := range later {
		w.stored(200)
		w.settled(m)
	}
	if got := w.value(); got != 0 {
		t.Fatalf("watermark %d with the oldest message in flight, want 0", got)
	}
	w.settled(old)
	if got, n := w.value(), len(w.marks); got != 200 || n != 0 {
		t.Fatalf("after the oldest settled: watermark %d with %d marks, want 200 with none", got, n)
	}
}
