// Package nats holds the NATS set-up for pleg-bridge (README.md) and the
// test of its server configurations: nats-server.conf (one server) and
// nats-cluster.conf (three) start as they are, with the accounts of
// pleg-bridge creds --init, and take the stream and the bucket commands of
// README.md.
package nats

import (
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// loadConfig copies file (a configuration of this directory) beside the
// resolver.conf of a, as README.md has it, and parses it as nats-server -c
// does. Only what no test can use is changed afterwards, by the caller:
// ports, store directory, route URLs.
func loadConfig(t *testing.T, file string, a *natsauth.Account) *server.Options {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "resolver.conf"), []byte(a.ServerConfig()), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, file)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server -c %s: %v", file, err)
	}
	return opts
}

// checkFile checks what both files promise: JetStream, monitoring on 8222,
// the operator of resolver.conf, and nats-server's default sync interval
// with the durability choice explained beside sync_interval: always,
// commented out.
func checkFile(t *testing.T, file string, opts *server.Options, a *natsauth.Account) {
	t.Helper()
	opPub, _ := a.Operator.PublicKey()
	sysPub, _ := a.System.PublicKey()
	switch {
	case !opts.JetStream:
		t.Errorf("%s: JetStream is off", file)
	case opts.HTTPPort != 8222:
		t.Errorf("%s: monitoring on %d, want 8222", file, opts.HTTPPort)
	case len(opts.TrustedOperators) != 1 || opts.TrustedOperators[0].Subject != opPub || opts.SystemAccount != sysPub:
		t.Errorf("%s: does not trust the operator of resolver.conf", file)
	case opts.SyncInterval != 0 || opts.SyncAlways:
		t.Errorf("%s: sync interval %s (always %v), want nats-server's default", file, opts.SyncInterval, opts.SyncAlways)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"every 2 minutes", "acknowledges a write", "power loss or an OS crash", "PLEG_REPAIR_WINDOW (default 5m)",
		"leader change", "republishes", "  # sync_interval: always\n", "throughput"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s: the durability comment does not say %q", file, want)
		}
	}
}

// setUp runs README.md's stream and bucket commands on the server at url
// as the administrator of creds --init: `nats stream add PLEG --config
// <streamFile>` and `nats kv add PLEG_STATE --history 1 --replicas
// <replicas> --storage file --marker-ttl 24h`; then checks that a bridge
// finds the stream as it wants it (publish.EnsureStream), and that a node
// minted with the node key publishes and writes its key on both.
func setUp(t *testing.T, url, streamFile string, replicas int, a *natsauth.Account) {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	admin := filepath.Join(dir, "admin.creds")
	if err := os.WriteFile(admin, a.AdminCreds, 0o600); err != nil {
		t.Fatal(err)
	}
	_, js := publishtest.Connect(t, url, nats.UserCredentials(admin))
	b, err := os.ReadFile(streamFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg jetstream.StreamConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("%s: %v", streamFile, err)
	}
	if cfg.Replicas != replicas {
		t.Errorf("%s has %d replicas, want %d", streamFile, cfg.Replicas, replicas)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatalf("nats stream add PLEG --config %s: %v", streamFile, err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: schemas.DefaultStateBucket, History: 1, Replicas: replicas, Storage: jetstream.FileStorage, LimitMarkerTTL: 24 * time.Hour,
	}); err != nil {
		t.Fatalf("nats kv add PLEG_STATE --replicas %d: %v", replicas, err)
	}
	if _, err := publish.EnsureStream(ctx, js, publish.StreamOptions{
		Name: schemas.DefaultStream, SubjectPrefix: schemas.DefaultSubjectPrefix, MaxAge: 7 * 24 * time.Hour, DuplicateWindow: 2 * time.Minute,
	}); err != nil {
		t.Errorf("a bridge does not take the stream of %s: %v", streamFile, err)
	}

	accPub, _ := a.Account.PublicKey()
	creds, err := natsauth.Mint(natsauth.MintOptions{SigningKey: a.NodeSigner, Account: accPub, Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(dir, "node-1.creds")
	if err := os.WriteFile(node, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	_, njs := publishtest.Connect(t, url, nats.UserCredentials(node), nats.CustomInboxPrefix(natsauth.InboxPrefix("node-1")))
	if _, err := njs.Publish(ctx, schemas.Subject("pleg", "node-1", "shop", "u1", "ContainerStarted"), []byte(`{}`)); err != nil {
		t.Errorf("node-1 cannot publish: %v", err)
	}
	kv, err := njs.KeyValue(ctx, schemas.DefaultStateBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "node-1.shop.web-0.u1.c1", []byte(`{}`)); err != nil {
		t.Errorf("node-1 cannot write its key: %v", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas; got != replicas {
		t.Errorf("the bucket has %d replicas, want %d", got, replicas)
	}
}

// TestOneServer starts nats-server.conf and runs README.md's set-up for
// one server: stream-1.json and a bucket of one replica.
func TestOneServer(t *testing.T) {
	t.Parallel()
	a, err := natsauth.NewAccount(natsauth.AccountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	opts := loadConfig(t, "nats-server.conf", a)
	checkFile(t, "nats-server.conf", opts, a)
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", -1, 0, t.TempDir()
	s := publishtest.RunServer(t, opts)
	setUp(t, s.ClientURL(), "stream-1.json", 1, a)
}

// TestThreeServers starts three servers from nats-cluster.conf, each named
// by NATS_SERVER_NAME as the file says, with the file's structure (every
// server routed to all three) on free loopback ports, and runs README.md's
// set-up for three: stream.json and a bucket of three replicas.
func TestThreeServers(t *testing.T) {
	a, err := natsauth.NewAccount(natsauth.AccountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var routes []*url.URL
	ports := freePorts(t, 3)
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))})
	}
	var servers []*server.Server
	for i, name := range []string{"nats-1", "nats-2", "nats-3"} {
		t.Setenv("NATS_SERVER_NAME", name)
		opts := loadConfig(t, "nats-cluster.conf", a)
		if opts.ServerName != name || opts.Cluster.Name != "pleg" || opts.Cluster.Port != 6222 || len(opts.Routes) != 3 {
			t.Fatalf("nats-cluster.conf: server %q, cluster %q on %d with %d routes; want %s, pleg on 6222, 3 routes",
				opts.ServerName, opts.Cluster.Name, opts.Cluster.Port, len(opts.Routes), name)
		}
		if i == 0 {
			checkFile(t, "nats-cluster.conf", opts, a)
		}
		opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", -1, 0, t.TempDir()
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", ports[i]
		opts.Routes = routes
		servers = append(servers, publishtest.RunServer(t, opts))
	}
	waitMetaLeader(t, servers)
	setUp(t, servers[0].ClientURL(), "stream.json", 3, a)
}

// freePorts returns n distinct loopback ports that were free a moment ago:
// the routes must be known before the first server starts, as in the file.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// waitMetaLeader waits until a JetStream meta leader sees all servers, or
// fails the test after 30s. The server offers no notification of the
// election, so this polls, as natsembed.StartCluster does.
func waitMetaLeader(t *testing.T, servers []*server.Server) {
	t.Helper()
	waittest.Until(t, 30*time.Second, "a JetStream meta leader that sees the three servers", func() (bool, error) {
		for _, s := range servers {
			if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == len(servers) {
				return true, nil
			}
		}
		return false, nil
	})
}
