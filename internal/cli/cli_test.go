package cli

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

func TestJSONLogsUseStandardKeysAndReadableDurations(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := NewLogger(&buf, LogJSON, slog.LevelInfo)
	logger.Debug("hidden")
	logger.Info("relist recovered", "took", 1500*time.Millisecond)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %q: %v", buf.String(), err)
	}
	if rec["level"] != "INFO" || rec["msg"] != "relist recovered" || rec["took"] != "1.5s" {
		t.Errorf("record = %v", rec)
	}
}
