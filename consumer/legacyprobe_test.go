package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// TestLegacyProbeRefusedReadsTheServersRefusal takes the refusals from a
// real server: a user who may not get a message by subject (as a reader
// limited to namespaces may not) makes LegacyAuto's request, on a stream
// that answers it by the API and on one that answers it directly, and
// publishes where it may not. Only the probe's refusals, of the stream
// named, are the probe's.
func TestLegacyProbeRefusedReadsTheServersRefusal(t *testing.T) {
	t.Parallel()
	deny := &server.SubjectPermission{Deny: []string{"$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>", "forbidden"}}
	s := publishtest.NewAuthServer(t, &server.Options{
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "reader", Password: "reader", Permissions: &server.Permissions{Publish: deny}},
		},
	})
	_, admin := publishtest.Connect(t, s.ClientURL(), nats.UserInfo("admin", "admin"))
	for name, direct := range map[string]bool{"PLEG": false, "DIRECTPLEG": true} {
		if _, err := admin.CreateStream(t.Context(), jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowDirect: direct}); err != nil {
			t.Fatal(err)
		}
	}

	errs := make(chan error, 8)
	_, js := publishtest.Connect(t, s.ClientURL(), nats.UserInfo("reader", "reader"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	next := func(what string) error {
		t.Helper()
		err := <-errs
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("%s: the error handler got %v, want a permission violation", what, err)
		}
		return err
	}
	for _, name := range []string{"PLEG", "DIRECTPLEG"} {
		st, err := js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		_, _ = st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(name+".node.*.*"))
		cancel()
		err = next("the get of " + name)
		if !consumer.LegacyProbeRefused(err, name) {
			t.Errorf("LegacyProbeRefused(%q, %s) = false, want true", err, name)
		}
		if consumer.LegacyProbeRefused(err, "OTHER") || consumer.LegacyProbeRefused(err, "") {
			t.Errorf("LegacyProbeRefused(%q) is true of another stream, or of none", err)
		}
	}
	nc := js.Conn()
	if err := nc.Publish("forbidden", nil); err != nil {
		t.Fatal(err)
	}
	if err := next("the publish"); consumer.LegacyProbeRefused(err, "PLEG") {
		t.Errorf("LegacyProbeRefused(%q, PLEG) = true of another refusal", err)
	}
	if consumer.LegacyProbeRefused(nil, "PLEG") {
		t.Error("LegacyProbeRefused(nil) = true")
	}
}
