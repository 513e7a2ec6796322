package gctune

import (
	"slices"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/generator"
)

// TestGenericModeTakesALowerTargetOnABigNode: from a live heap of 8 MiB
// after the first relist (about 500 pods), generic mode's relists every
// second would double a big heap.
func TestGenericModeTakesALowerTargetOnABigNode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode generator.Mode
		heap uint64
		want int
	}{
		{generator.ModeGeneric, GenericBigHeap - 1, SteadyPercent},
		{generator.ModeGeneric, GenericBigHeap, GenericPercent},
		{generator.ModeEvented, 200 << 20, SteadyPercent},
		{generator.ModeAuto, 200 << 20, SteadyPercent},
	} {
		if got := Steady(tc.mode, tc.heap); got != tc.want {
			t.Errorf("%s mode, live heap %d MiB: target %d, want %d", tc.mode, tc.heap>>20, got, tc.want)
		}
	}
}

// TestTheTargetsInTurn: the start-up target at Start, a steady one at the
// end of the start-up, Go's own at Stop; nothing at all if GOGC chose.
func TestTheTargetsInTurn(t *testing.T) {
	t.Parallel()
	for _, gogc := range []bool{false, true} {
		var set []int
		tu := start(generator.ModeEvented, gogc, func(p int) { set = append(set, p) })
		tu.StartupOver()
		tu.Stop()
		want := []int{StartupPercent, SteadyPercent, SteadyPercent}
		if gogc {
			want = nil
		}
		if !slices.Equal(set, want) {
			t.Errorf("GOGC set %v: targets %v, want %v", gogc, set, want)
		}
	}
}
