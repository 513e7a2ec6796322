package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/natsauth/natsauthtest"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// TestCredsMintsCredentialsThatPublishOnlyTheirNode runs pleg-bridge creds
// against a server in operator mode: the file it writes (mode 0600)
// connects, with the inbox prefix PLEG_NATS_INBOX_PREFIX=_INBOX_{node}
// gives, and publishes the node's events and not another node's.
func TestCredsMintsCredentialsThatPublishOnlyTheirNode(t *testing.T) {
	t.Parallel()
	srv := natsauthtest.Start(t, natsauth.Names{})
	_, admin := publishtest.Connect(t, srv.URL, nats.UserCredentials(srv.AdminCreds))
	if _, err := admin.CreateStream(t.Context(), jetstream.StreamConfig{Name: "PLEG", Subjects: []string{"pleg.>"}}); err != nil {
		t.Fatal(err)
	}

	out := filepath.Join(t.TempDir(), "nats.creds")
	args := []string{"creds", "--signing-key", srv.SigningKeyFile, "--account-jwt", srv.AccountJWTFile, "--node", "node-1.example.com", "--out", out}
	if err := run(t.Context(), args, envFrom(t, nil), io.Discard, io.Discard); err != nil {
		t.Fatalf("creds: %v", err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the credentials file: %v, mode %v, want 0600", err, fi.Mode())
	}
	cfg, err := loadConfig(envFrom(t, map[string]string{"PLEG_NODE_NAME": "node-1.example.com", "PLEG_NATS_INBOX_PREFIX": "_INBOX_{node}"}))
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := bridge.ExpandInboxPrefix(cfg.bridgeOptions(nil, nil).NATS.InboxPrefix, cfg.NodeName)
	if err != nil || inbox != natsauth.InboxPrefix("node-1.example.com") {
		t.Fatalf("PLEG_NATS_INBOX_PREFIX=_INBOX_{node} gives %q, %v; the credentials allow %s", inbox, err, natsauth.InboxPrefix("node-1.example.com"))
	}
	_, js := publishtest.Connect(t, srv.URL, nats.UserCredentials(out), nats.CustomInboxPrefix(inbox))
	if _, err := js.Publish(t.Context(), "pleg.node-1_example_com.u1.ContainerStarted", []byte(`{}`)); err != nil {
		t.Errorf("the minted credentials cannot publish their node's event: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "pleg.node-2.u1.ContainerStarted", []byte(`{}`)); err == nil {
		t.Error("the minted credentials publish as node-2")
	}

	// The node's name from PLEG_NODE_NAME, the account by its key, the
	// credentials on stdout.
	var stdout bytes.Buffer
	args = []string{"creds", "--signing-key", srv.SigningKeyFile, "--account", srv.Account}
	if err := run(t.Context(), args, envFrom(t, map[string]string{"PLEG_NODE_NAME": "node-2"}), &stdout, io.Discard); err != nil {
		t.Fatalf("creds: %v", err)
	}
	token, err := jwt.ParseDecoratedJWT(stdout.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if uc, err := jwt.DecodeUserClaims(token); err != nil || uc.Name != "node-2" || uc.IssuerAccount != srv.Account {
		t.Errorf("creds on stdout: %+v, %v; want a user node-2 of account %s", uc, err, srv.Account)
	}
}

// TestCredsRefusesWhatWouldMintTheWrongUser checks the usage errors, and
// that a signing key without a scope (whose users would get every
// permission of the account) is refused when the account JWT is given.
func TestCredsRefusesWhatWouldMintTheWrongUser(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	operator, _ := nkeys.CreateOperator()
	account, _ := nkeys.CreateAccount()
	signer, _ := nkeys.CreateAccount()
	apub, _ := account.PublicKey()
	spub, _ := signer.PublicKey()
	seed, _ := signer.Seed()
	keyFile := filepath.Join(dir, "signer.nk")
	if err := os.WriteFile(keyFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	writeAccount := func(name string, scope *jwt.UserScope) string {
		ac := jwt.NewAccountClaims(apub)
		ac.Name = "PLEG"
		if scope != nil {
			ac.SigningKeys.AddScopedSigner(scope)
		} else {
			ac.SigningKeys.Add(spub)
		}
		token, err := ac.Encode(operator)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	otherRole := jwt.NewUserScope()
	otherRole.Key, otherRole.Role = spub, "admin"
	nodeRole := jwt.NewUserScope()
	nodeRole.Key, nodeRole.Role = spub, natsauth.Role

	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no signing key", []string{"--account", apub, "--node", "n"}, "--signing-key is required"},
		{"no node", []string{"--signing-key", keyFile, "--account", apub}, "--node is required"},
		{"both accounts", []string{"--signing-key", keyFile, "--account", apub, "--account-jwt", "x", "--node", "n"}, "one of --account and --account-jwt"},
		{"an unscoped key", []string{"--signing-key", keyFile, "--account-jwt", writeAccount("unscoped.jwt", nil), "--node", "n"}, "has no scope"},
		{"another role", []string{"--signing-key", keyFile, "--account-jwt", writeAccount("admin.jwt", otherRole), "--node", "n"}, `role "admin"`},
		{"a node name of two tokens", []string{"--signing-key", keyFile, "--account", apub, "--node", "node_1"}, "differ"},
		{"the account's own key", []string{"--signing-key", keyFile, "--account", spub, "--node", "n"}, "own identity key, not a scoped signing key"},
		{"a name that is no namespace, before anything else", []string{"--reader", "-n", "shop,Pay.ments"}, `--namespace: invalid namespace "Pay.ments"`},
		{"a namespace without --reader", []string{"--signing-key", keyFile, "--account", apub, "--node", "n", "-n", "shop"}, "add --reader"},
		{"a reader with a node", []string{"--signing-key", keyFile, "--account", apub, "--reader", "-n", "shop", "--node", "n"}, "--node is for a node's credentials, --reader for a reader's"},
		{"a reader without a namespace", []string{"--signing-key", keyFile, "--account", apub, "--reader"}, "--namespace is required with --reader"},
		{"a group that cannot be a tag", []string{"--signing-key", keyFile, "--account", apub, "--reader", "-n", "shop", "--group", "Billing"}, `--group: group name "Billing"`},
		{"a node's key for a reader", []string{"--signing-key", keyFile, "--account-jwt", writeAccount("node.jwt", nodeRole), "--reader", "-n", "shop"}, `role "pleg-node", want "pleg-reader"`},
	} {
		var stdout bytes.Buffer
		err := run(t.Context(), append([]string{"creds"}, tt.args...), envFrom(t, nil), &stdout, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: creds = %v, want an error with %q", tt.name, err, tt.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("%s: creds wrote %q", tt.name, stdout.String())
		}
	}
}

// TestCredsSaysWhatItDidNotCheck: with --account alone, nothing says the
// signing key belongs to the account; creds says so on stderr, naming the
// key, the account and --account-jwt. With --account-jwt it checked, and
// says only what the node's bridge needs beside the file.
func TestCredsSaysWhatItDidNotCheck(t *testing.T) {
	t.Parallel()
	srv := natsauthtest.Start(t, natsauth.Names{})
	unrelated, _ := nkeys.CreateAccount()
	upub, _ := unrelated.PublicKey()
	signer, err := os.ReadFile(srv.SigningKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := jwt.ParseDecoratedNKey(signer)
	if err != nil {
		t.Fatal(err)
	}
	spub, _ := key.PublicKey()

	var stdout, stderr bytes.Buffer
	args := []string{"creds", "--signing-key", srv.SigningKeyFile, "--account", upub, "--node", "n"}
	if err := run(t.Context(), args, envFrom(t, nil), &stdout, &stderr); err != nil {
		t.Fatalf("creds: %v", err)
	}
	for _, want := range []string{"NOT checked", spub, upub, "--account-jwt"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("creds --account with a key of another account: stderr %q does not say %q", stderr.String(), want)
		}
	}

	stderr.Reset()
	args = []string{"creds", "--signing-key", srv.SigningKeyFile, "--account-jwt", srv.AccountJWTFile, "--node", "n"}
	if err := run(t.Context(), args, envFrom(t, nil), io.Discard, &stderr); err != nil {
		t.Fatalf("creds: %v", err)
	}
	if strings.Contains(stderr.String(), "warning") {
		t.Errorf("creds --account-jwt, which checks the key, warned: %q", stderr.String())
	}
	// What the node's bridge needs beside the file, as for a reader.
	for _, want := range []string{"_INBOX_n only", "PLEG_NATS_INBOX_PREFIX=_INBOX_{node}", "PLEG_STREAM_MANAGE=false"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("creds --node says %q, want %q", stderr.String(), want)
		}
	}
}

func TestNATSInboxPrefixMustBeALiteralSubject(t *testing.T) {
	t.Parallel()
	_, err := loadConfig(envFrom(t, map[string]string{"PLEG_NATS_URL": "nats://x:4222", "PLEG_NATS_INBOX_PREFIX": "_INBOX.>"}))
	if err == nil || !strings.Contains(err.Error(), "PLEG_NATS_INBOX_PREFIX") {
		t.Errorf("loadConfig with PLEG_NATS_INBOX_PREFIX=_INBOX.> = %v, want an error naming it", err)
	}
	cfg, err := loadConfig(envFrom(t, map[string]string{"PLEG_NODE_NAME": "node-1.example.com", "PLEG_NATS_INBOX_PREFIX": "_INBOX_{node}"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.bridgeOptions(nil, nil).NATS.InboxPrefix; got != "_INBOX_{node}" {
		t.Errorf("the bridge gets inbox prefix %q, want the pattern it expands", got)
	}
}

// TestNATSReadmeSigningKeyStepGrantsTheTemplate checks that the nsc steps
// of deploy/nats/README.md give the scoped signing keys exactly the
// permissions natsauth.NodeTemplate and natsauth.ReaderTemplate give them
// in the tests.
func TestNATSReadmeSigningKeyStepGrantsTheTemplate(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for role, want := range map[string]jwt.Permissions{
		natsauth.Role:       natsauth.NodeTemplate(natsauth.Names{}),
		natsauth.ReaderRole: natsauth.ReaderTemplate(natsauth.Names{}),
	} {
		pub, sub := readmeSigningKeyStep(string(b), role)
		slices.Sort(pub)
		slices.Sort(sub)
		wantPub, wantSub := slices.Sorted(slices.Values(want.Pub.Allow)), slices.Sorted(slices.Values(want.Sub.Allow))
		if !slices.Equal(pub, wantPub) || !slices.Equal(sub, wantSub) {
			t.Errorf("the README's nsc edit signing-key --role %s grants\npub %q\nsub %q\nwant\npub %q\nsub %q", role, pub, sub, wantPub, wantSub)
		}
	}
}

// readmeSigningKeyStep returns the subjects that the README's "nsc edit
// signing-key ... --role role" command allows to publish and subscribe to.
func readmeSigningKeyStep(readme, role string) (pub, sub []string) {
	in := false
	for line := range strings.Lines(readme) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "nsc edit signing-key") && strings.Contains(line, "--role "+role+" ") {
			in = true
		}
		if !in {
			continue
		}
		for _, f := range []struct {
			flag string
			to   *[]string
		}{{"--allow-pub '", &pub}, {"--allow-sub '", &sub}} {
			if _, rest, ok := strings.Cut(line, f.flag); ok {
				list, _, _ := strings.Cut(rest, "'")
				*f.to = append(*f.to, strings.Split(list, ",")...)
			}
		}
		if !strings.HasSuffix(line, `\`) {
			break
		}
	}
	return pub, sub
}

// TestCredsMintsAReaderOfItsNamespacesOnly runs pleg-bridge creds --reader
// against a server in operator mode, and the reader's tools with the file
// and the inbox prefix it names: replay and ps of shop print shop's events
// and containers; payments, the whole stream and the whole bucket are
// refused at once, with the refused subject in the error.
func TestCredsMintsAReaderOfItsNamespacesOnly(t *testing.T) {
	t.Parallel()
	srv := natsauthtest.Start(t, natsauth.Names{})
	_, admin := publishtest.Connect(t, srv.URL, nats.UserCredentials(srv.AdminCreds))
	ctx := t.Context()
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "PLEG", Subjects: []string{"pleg.>"}}); err != nil {
		t.Fatal(err)
	}
	kv, err := admin.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "PLEG_STATE"})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1", SubjectPrefix: "pleg"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []generator.Pod{
		{UID: "u-web", Namespace: "shop", Name: "web-0"},
		{UID: "u-pay", Namespace: "payments", Name: "pay-0"},
		{UID: "u-api", Namespace: "shop", Name: "api-0"},
	} {
		at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
		msg, err := enc.Encode(generator.Event{
			Type: generator.ContainerStarted, Pod: p, State: generator.StateRunning, Time: at, ObservedAt: at,
			Container: generator.Container{ID: "c-" + p.UID, Name: "app", Image: "registry.example/app:1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		key := schemas.StateKey(schemas.StateRef{Node: "node-1", Namespace: p.Namespace, Pod: p.Name, PodUID: p.UID, ContainerID: "c-" + p.UID})
		if _, err := kv.Put(ctx, key, msg.Data); err != nil {
			t.Fatal(err)
		}
	}

	out := filepath.Join(t.TempDir(), "shop.creds")
	var stderr bytes.Buffer
	args := []string{"creds", "--reader", "-n", "shop", "--signing-key", srv.ReaderSigningKeyFile, "--account-jwt", srv.AccountJWTFile, "--out", out}
	if err := run(ctx, args, envFrom(t, map[string]string{"PLEG_NODE_NAME": "node-1"}), io.Discard, &stderr); err != nil {
		t.Fatalf("creds --reader: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := natsauth.ReaderInboxPrefix(b)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), "--inbox-prefix "+inbox) {
		t.Errorf("creds --reader says %q, want the inbox prefix %s", stderr.String(), inbox)
	}

	reader := []string{"--nats-url", srv.URL, "--creds", out, "--inbox-prefix", inbox}
	for _, tt := range []struct {
		args       []string
		want, deny []string
	}{
		{[]string{"replay", "-n", "shop"}, []string{"shop/web-0/app", "shop/api-0/app"}, []string{"payments"}},
		{[]string{"ps", "-n", "shop"}, []string{"web-0", "api-0"}, []string{"pay-0"}},
		{[]string{"ps", "--pod", "shop/web-0"}, []string{"web-0"}, []string{"pay-0", "api-0"}},
		// The reader's credentials say its inbox: --inbox-prefix may be
		// left out.
		{[]string{"replay", "-n", "shop", "--inbox-prefix", ""}, []string{"shop/web-0/app"}, []string{"payments"}},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(ctx, append(append([]string(nil), reader...), tt.args...), envFrom(t, nil), &stdout, &stderr); err != nil {
			t.Errorf("%s as the reader of shop: %v (stderr %s)", strings.Join(tt.args, " "), err, stderr.String())
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("%s as the reader of shop printed %q, want %s", strings.Join(tt.args, " "), stdout.String(), w)
			}
		}
		for _, d := range tt.deny {
			if strings.Contains(stdout.String(), d) {
				t.Errorf("%s as the reader of shop printed %q, with %s", strings.Join(tt.args, " "), stdout.String(), d)
			}
		}
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "-n", "payments"}, ".pleg.*.payments.>"},
		{[]string{"replay", "--node", "node-1"}, ".pleg.node-1.>"},
		// tail's hint, which looks the namespace up in the state bucket,
		// is refused on a connection of its own and gives no hint: the
		// refusal is the events'.
		{[]string{"tail", "-n", "payments"}, ".pleg.*.payments.>"},
		{[]string{"tail"}, ".pleg.>"},
		{[]string{"ps", "-n", "payments"}, ".$KV.PLEG_STATE.*.payments.>"},
		{[]string{"ps"}, ".$KV.PLEG_STATE.>"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(ctx, append(tt.args, reader...), envFrom(t, nil), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), "$JS.API.CONSUMER.CREATE.") || !strings.Contains(err.Error(), tt.want+`"`) {
			t.Errorf("%s as the reader of shop = %v, want a refusal naming the consumer on %s", strings.Join(tt.args, " "), err, tt.want)
		}
		if strings.Contains(stdout.String(), "pay-0") {
			t.Errorf("%s as the reader of shop printed %q", strings.Join(tt.args, " "), stdout.String())
		}
	}
}
