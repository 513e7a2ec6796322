package generator_test

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pleg-bridge/pleg-bridge/crisim"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/generator/generatortest"
)

func TestOptionsWithoutAModeFollowTheRuntimesEvents(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rt := generatortest.NewFakeRuntime(crisim.Containerd24Options())
		gen := generator.New(rt, generatortest.NewRecorder(), generator.Options{Logger: slog.New(slog.DiscardHandler)})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- gen.Run(ctx) }()
		advance(time.Second)
		// DefaultMode is auto: on containerd 2.4 it opens the CRI stream.
		if gen.Mode() != generator.ModeEvented || rt.OpenStreams() != 1 {
			t.Errorf("mode = %s with %d streams, want evented with 1 (DefaultMode %s)", gen.Mode(), rt.OpenStreams(), generator.DefaultMode)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}
