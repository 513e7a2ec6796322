package schemastest_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pleg-bridge/pleg-bridge/schemas"
	"github.com/pleg-bridge/pleg-bridge/schemas/schemastest"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func TestValidateFailsTheTestWithTheViolation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		ceType   string
		data     string
		wantErrs []string // fragments of the one failure; none: no failure
	}{
		{
			name:   "valid data does not fail",
			ceType: schemas.TypeContainerRemoved,
			data: `{"node":"n","pod":{"uid":"u"},"container":{"id":"c","attempt":0,"sandbox":false},
				"state":"removed","detectedBy":"relist","observedAt":"2026-01-02T03:04:05Z"}`,
		},
		{
			name:   "a wrong detectedBy is reported with where it is",
			ceType: schemas.TypeContainerRemoved,
			data: `{"node":"n","pod":{"uid":"u"},"container":{"id":"c","attempt":0,"sandbox":false},
				"state":"removed","detectedBy":"poll","observedAt":"2026-01-02T03:04:05Z"}`,
			wantErrs: []string{"pleg.v1.ContainerRemoved data is invalid", "/detectedBy", "poll"},
		},
		{
			name:     "an unknown type is reported",
			ceType:   "pleg.v1.ContainerChanged",
			data:     `{}`,
			wantErrs: []string{`no schema for CloudEvent type "pleg.v1.ContainerChanged"`},
		},
		{
			name:     "data that is not JSON is reported",
			ceType:   schemas.TypeContainerDied,
			data:     `{"node":`,
			wantErrs: []string{"parse pleg.v1.ContainerDied data"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &recorder{TB: t}
			schemastest.Validate(r, tt.ceType, []byte(tt.data))
			if len(tt.wantErrs) == 0 {
				if len(r.errs) != 0 {
					t.Errorf("Validate failed the test: %q", r.errs)
				}
				return
			}
			if len(r.errs) != 1 {
				t.Fatalf("Validate reported %d failures, want 1: %q", len(r.errs), r.errs)
			}
			for _, want := range tt.wantErrs {
				if !strings.Contains(r.errs[0], want) {
					t.Errorf("failure %q does not contain %q", r.errs[0], want)
				}
			}
		})
	}
}

func TestValidateCloudEventFailsTheTestWithEveryProblem(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	schemastest.ValidateCloudEvent(r, []byte(`{"specversion":"0.3","type":"pleg.v1.ContainerDied"}`))
	if len(r.errs) != 1 {
		t.Fatalf("ValidateCloudEvent reported %d failures, want 1: %q", len(r.errs), r.errs)
	}
	for _, want := range []string{"specversion", "attribute id is missing", "attribute dataschema is missing", "data is missing"} {
		if !strings.Contains(r.errs[0], want) {
			t.Errorf("failure %q does not list %q", r.errs[0], want)
		}
	}
}
