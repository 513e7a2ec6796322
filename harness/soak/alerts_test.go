package soak

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The Alertmanager soak's verdicts, on a schedule of a baseline, a NATS
// outage in a window of a minute and a half, and a recovery.
func TestJudgeAlerts(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	windows := []Window{
		{Name: "baseline", From: at(0), To: at(30)},
		{Name: FaultNATSOutage, From: at(30), To: at(120)},
		{Name: "recovery", From: at(120), To: at(150)},
	}
	faults := []FaultRecord{{Name: FaultNATSOutage, At: at(30)}}
	stalled := rule{Alert: "PlegBridgeDeliveryStalled", For: "5s"}
	lost := rule{Alert: "PlegBridgeEventsLost"}
	unknown := rule{Alert: "PlegBridgeSomethingNew", For: "1s"}
	// The deadline: the condition's build-up, the for, two scrapes and
	// the notification, whatever the time scale makes of them.
	late := alertExpectations[stalled.Alert].deadline(stalled)
	if 30*time.Second+late+5*time.Second > 110*time.Second {
		t.Fatalf("the deadline of %v leaves no room in the outage's window", late)
	}
	tests := []struct {
		name     string
		rule     rule
		episodes []Episode
		want     []string // problems, by a part of each
	}{
		{"an expected alert that fires in time and resolves passes", stalled,
			[]Episode{{Fired: at(46), Resolved: at(65)}}, nil},
		{"an expected alert that does not fire fails", stalled,
			nil, []string{"did not fire in the nats-outage window"}},
		{"an expected alert that fires after its deadline fails", stalled,
			[]Episode{{Fired: at(30).Add(late + 5*time.Second), Resolved: at(110)}},
			[]string{fmt.Sprintf("fired %v after nats-outage began, later than its %v", late+5*time.Second, late)}},
		{"an expected alert that never resolves fails", stalled,
			[]Episode{{Fired: at(46)}}, []string{"never resolved"}},
		{"an expected alert that resolves long after its window fails", stalled,
			[]Episode{{Fired: at(46), Resolved: at(135)}}, []string{"resolved 15s after the nats-outage window ended"}},
		{"an alert that fires in the baseline fails", stalled,
			[]Episode{{Fired: at(10), Resolved: at(12)}, {Fired: at(46), Resolved: at(65)}}, []string{"in no window of a fault that fires it"}},
		{"an alert no fault fires passes while it stays silent", lost,
			nil, nil},
		{"an alert no fault fires fails when it fires", lost,
			[]Episode{{Fired: at(40), Resolved: at(41)}}, []string{"in no window of a fault that fires it"}},
		{"an alert the soak knows nothing of fails", unknown,
			nil, []string{"no fault of the soak is known to fire it"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := judgeAlerts([]rule{tt.rule}, windows, faults, map[string][]Episode{tt.rule.Alert: tt.episodes})
			if len(got) != 1 {
				t.Fatalf("got %d results, want 1", len(got))
			}
			if len(got[0].Problems) != len(tt.want) {
				t.Fatalf("problems = %q, want %d like %q", got[0].Problems, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[0].Problems[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[0].Problems[i], w)
				}
			}
		})
	}
}

// Every alert of the shipped rules has an expectation: a fault that fires
// it, or the reason none can.
func TestEveryShippedAlertIsExpectedOrSaysWhyNot(t *testing.T) {
	o := Options{RulesFile: "../../deploy/prometheus/rules.yml", DashboardFile: "../../deploy/grafana/pleg-bridge.json"}
	if err := o.loadAlerting(); err != nil {
		t.Fatal(err)
	}
	for _, r := range o.rules {
		exp, ok := alertExpectations[r.Alert]
		switch {
		case !ok:
			t.Errorf("%s: no expectation in alertExpectations", r.Alert)
		case len(exp.Fires) == 0 && exp.NotExpected == "":
			t.Errorf("%s: no fault fires it, and NotExpected does not say why", r.Alert)
		case len(exp.Fires) > 0 && exp.NotExpected != "":
			t.Errorf("%s: both fired by %v and not expected", r.Alert, exp.Fires)
		}
	}
}

// The webhook records each alert's firing and resolution once, by the
// time the notification came, whatever Alertmanager repeats.
func TestAlertReceiverRecordsEpisodes(t *testing.T) {
	r, err := newAlertReceiver()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.lis.Close() })
	post := func(body string) {
		t.Helper()
		rec := httptest.NewRecorder()
		r.srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/alerts", bytes.NewBufferString(body)))
		if rec.Code != http.StatusOK {
			t.Fatalf("POST /alerts: %d %s", rec.Code, rec.Body)
		}
	}
	msg := func(status string) string {
		return `{"status":"` + status + `","alerts":[{"status":"` + status + `","labels":{"alertname":"PlegBridgeDown","node":"soak-node"}}]}`
	}
	post(msg("firing"))
	post(msg("firing")) // a repeat
	post(msg("resolved"))
	post(msg("resolved"))
	post(msg("firing"))
	eps, _ := r.snapshot()
	got := eps["PlegBridgeDown"]
	if len(got) != 2 || got[0].Resolved.IsZero() || !got[1].Resolved.IsZero() {
		t.Errorf("episodes = %+v, want one resolved, then one firing", got)
	}
	if diff := cmp.Diff([]string{"PlegBridgeDown"}, firing(eps)); diff != "" {
		t.Errorf("firing (-want +got):\n%s", diff)
	}
}
