package logtest_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/internal/logtest"
)

func TestBufferKeepsEveryConcurrentWrite(t *testing.T) {
	var b logtest.Buffer
	log := b.JSONLogger(slog.LevelInfo)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				log.Warn("w")
				log.Info("i")
				log.Debug("d")
			}
		})
	}
	wg.Wait()
	if n := len(b.Records(t, "WARN")); n != 400 {
		t.Errorf("Records(WARN) = %d records, want 400", n)
	}
	if n := len(b.Records(t, "")); n != 800 {
		t.Errorf("Records(\"\") = %d records, want 800 (Debug is below the logger's level)", n)
	}
	if n := len(b.TakeRecords(t, "INFO")); n != 400 {
		t.Errorf("TakeRecords(INFO) = %d records, want 400", n)
	}
	if s := b.String(); s != "" {
		t.Errorf("after TakeRecords the buffer holds %q, want nothing", s)
	}
}

func TestChangedSignalsAWrite(t *testing.T) {
	var b logtest.Buffer
	changed := b.Changed()
	select {
	case <-changed:
		t.Fatal("Changed signalled before any write")
	default:
	}
	go b.Write([]byte("hello\n"))
	<-changed
	if got := b.Take(); got != "hello\n" {
		t.Errorf("Take = %q, want %q", got, "hello\n")
	}
}

func TestRecordsNamesALineThatIsNotJSON(t *testing.T) {
	var b logtest.Buffer
	b.Write([]byte("plain text\n"))
	ft := &fatalT{TB: t}
	func() {
		defer func() { recover() }()
		b.Records(ft, "")
	}()
	if !strings.Contains(ft.msg, `"plain text\n"`) {
		t.Errorf("Records failed with %q, want it to name the line", ft.msg)
	}
}

// fatalT records the message of Fatalf and stops the caller there.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("Fatalf")
}
