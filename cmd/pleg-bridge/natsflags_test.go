package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// authEnv is a JetStream server that wants a user and a password: "admin"
// may do anything, "narrow" may only look up streams.
func authEnv(t *testing.T) *testEnv {
	t.Helper()
	s := publishtest.RunServer(t, &server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{
			{Username: "admin", Password: "s3cret"},
			{Username: "narrow", Password: "n4rrow", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.INFO", "$JS.API.STREAM.INFO.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		},
	})
	nc, js := publishtest.Connect(t, s.ClientURL(), nats.UserInfo("admin", "s3cret"))
	if _, err := publish.EnsureStream(t.Context(), js, publish.StreamOptions{Name: testStream, SubjectPrefix: testPrefix}); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	return &testEnv{url: s.ClientURL(), nc: nc, js: js}
}

func TestReadersAuthenticateAsTheBridgeDoes(t *testing.T) {
	t.Parallel()
	env := authEnv(t)
	env.publish(t, "node-1", lifecycle(generator.ContainerStarted, web, "app", 3*time.Hour))
	withUser := func(user, password string) lookupFunc {
		return lookupOf(func(k string) string {
			switch k {
			case "PLEG_NATS_USER":
				return user
			case "PLEG_NATS_PASSWORD":
				return password
			}
			return env.getenv(k)
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()

	var out, errs strings.Builder
	err := run(ctx, []string{"replay", "-n", "default"}, env.lookup, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "Authorization Violation") {
		t.Errorf("replay without credentials = %v, want an authorization violation", err)
	}

	out.Reset()
	if err := run(ctx, []string{"replay", "-n", "default"}, withUser("admin", "s3cret"), &out, &errs); err != nil {
		t.Fatalf("replay as admin from PLEG_NATS_USER/PASSWORD: %v (stderr %s)", err, errs.String())
	}
	if !strings.Contains(out.String(), "default/web-0/app") {
		t.Errorf("replay as admin printed %q, want the event of default/web-0/app", out.String())
	}

	out.Reset()
	if err := run(ctx, []string{"ps", "--all", "--user", "admin", "--password", "s3cret", "--bucket", "NONE"}, env.lookup, &out, &errs); err == nil || !strings.Contains(err.Error(), "state bucket NONE not found") {
		t.Errorf("ps as admin by flags = %v, want it to reach the server and find no bucket NONE", err)
	}

	// A user who may not create consumers: the refusal comes back at once,
	// naming the permission, not as a timeout.
	for _, cmd := range [][]string{{"replay", "-n", "default"}, {"tail", "--all"}} {
		err := run(ctx, cmd, withUser("narrow", "n4rrow"), &out, &errs)
		if err == nil || !strings.Contains(err.Error(), "NATS refused it") || !strings.Contains(err.Error(), "$JS.API.CONSUMER.CREATE."+testStream) {
			t.Errorf("%s as a user who may not create consumers = %v, want a refusal naming $JS.API.CONSUMER.CREATE.%s", cmd[0], err, testStream)
		}
	}
}

func TestReadersRefuseCredentialsThatCannotGoTogether(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	for _, tt := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--token", "a", "--token-file", "/x"}, "--token and --token-file"},
		{[]string{"--tls-cert", "/c"}, "--tls-cert and --tls-key"},
		{[]string{"--creds", "/c", "--nkey", "/k"}, "--creds and --nkey"},
	} {
		var out, errs strings.Builder
		err := run(t.Context(), append([]string{"replay", "-n", "default"}, tt.args...), env.lookup, &out, &errs)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("replay %s = %v, want an error naming %s", strings.Join(tt.args, " "), err, tt.wantErr)
		}
	}
}

func TestReadersUseTheNatsCLIContexts(t *testing.T) {
	t.Parallel()
	env := authEnv(t)
	env.publish(t, "node-1", lifecycle(generator.ContainerStarted, web, "app", 3*time.Hour))
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "nats", "context"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "nats", name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("context/lab.json", `{"description": "the lab", "url": "`+env.url+`", "user": "admin", "password": "s3cret"}`)
	write("context/wrong.json", `{"url": "`+env.url+`", "user": "admin", "password": "nope"}`)
	write("context.txt", "lab\n")
	lookup := func(extra map[string]string) lookupFunc {
		return lookupOf(func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			if k == "XDG_CONFIG_HOME" {
				return dir
			}
			if k == "PLEG_NATS_URL" {
				return "" // the context says where
			}
			return env.getenv(k)
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	tests := []struct {
		name    string
		args    []string
		extra   map[string]string
		wantErr string
	}{
		{name: "the selected context", args: nil},
		{name: "a named context", args: []string{"--context", "lab"}},
		{name: "NATS_CONTEXT names it", extra: map[string]string{"NATS_CONTEXT": "lab"}},
		{name: "a flag overrides the context", args: []string{"--context", "wrong", "--password", "s3cret"}},
		{name: "a variable overrides the context", args: []string{"--context", "wrong"}, extra: map[string]string{"PLEG_NATS_PASSWORD": "s3cret"}},
		{name: "the context's wrong password is used", args: []string{"--context", "wrong"}, wantErr: "Authorization Violation"},
		{name: "a missing context names its file", args: []string{"--context", "nope"}, wantErr: filepath.Join(dir, "nats", "context", "nope.json")},
	}
	for _, tt := range tests {
		var out, errs strings.Builder
		err := run(ctx, append([]string{"replay", "-n", "default"}, tt.args...), lookup(tt.extra), &out, &errs)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: replay = %v, want an error containing %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !strings.Contains(out.String(), "default/web-0/app") {
			t.Errorf("%s: replay = %v, printed %q (stderr %q), want the event of default/web-0/app", tt.name, err, out.String(), errs.String())
		}
	}
}
