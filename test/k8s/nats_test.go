//go:build k8s

package k8s

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// natsAuth is how the host's NATS authenticates its users.
type natsAuth int

const (
	// authCreds is operator (JWT) mode: the user has a credentials file.
	authCreds natsAuth = iota
	// authNKey is a static configuration with an NKey user, as
	// deploy/nats/accounts.conf has: the user has an NKey seed.
	authNKey
	// authNodeCreds is operator mode set up by the project alone, as
	// deploy/nats/README.md ("NATS as a process") and docs/deployment.md
	// say: pleg-bridge creds --init, nats-server.conf with its
	// resolver.conf, the stream and the bucket of one replica made by the
	// administrator, and the node's own credentials from creds --node.
	authNodeCreds
)

// hostNATS is a NATS server on the node, outside the cluster, as a user's
// NATS would be: JetStream on, listening on the node's address, which the
// pod network reaches through the CNI bridge's gateway, and requiring one
// kind of credential.
type hostNATS struct {
	URL string // nats://<node IP>:<port>
	// Creds (authCreds) is a credentials file of a user of the account,
	// NKeySeed (authNKey) the seed of the NKey user, for the Secret.
	Creds, NKeySeed []byte
	js              jetstream.JetStream
	// opts start the server again on its port and store (restart).
	opts   *server.Options
	server *server.Server
}

// stop shuts the server down: the bridge loses NATS, and its clients
// (the test's among them) try to reconnect.
func (h *hostNATS) stop() {
	h.server.Shutdown()
	h.server.WaitForShutdown()
}

// restart starts the server again, after stop, on the same port with the
// same store and credentials: the stream is as it was.
func (h *hostNATS) restart(t *testing.T) {
	t.Helper()
	h.server = publishtest.RunServer(t, h.opts.Clone())
}

// startHostNATS runs the server, requiring auth, until the test ends and
// creates the stream of deploy/nats/stream.json with one replica, as an
// operator would before installing the bridge (the bridge's default
// PLEG_STREAM_REPLICAS is 3, for a cluster; it accepts an existing stream
// as it is).
func startHostNATS(t *testing.T, auth natsAuth) *hostNATS {
	t.Helper()
	key := func(create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, string) {
		kp, err := create()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		return kp, pub
	}
	opts := &server.Options{Host: suite.nodeIP, Port: -1, JetStream: true, StoreDir: filepath.Join(t.TempDir(), "js")}
	h := &hostNATS{}
	var connect nats.Option
	var streamFile = "stream.json"
	switch auth {
	case authNodeCreds:
		var admin string
		opts, admin, h.Creds = projectNATS(t)
		connect = nats.UserCredentials(admin)
		streamFile = "stream-1.json"
	case authNKey:
		user, userPub := key(nkeys.CreateUser)
		seed, err := user.Seed()
		if err != nil {
			t.Fatal(err)
		}
		opts.Nkeys = []*server.NkeyUser{{Nkey: userPub}}
		h.NKeySeed = append(seed, '\n')
		connect = nats.Nkey(userPub, user.Sign)
	default:
		h.Creds = operatorMode(t, opts, key)
		credsFile := filepath.Join(t.TempDir(), "test.creds")
		if err := os.WriteFile(credsFile, h.Creds, 0o600); err != nil {
			t.Fatal(err)
		}
		connect = nats.UserCredentials(credsFile)
	}

	h.opts = opts.Clone()
	s := publishtest.RunServer(t, opts)
	h.server = s
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("nats server address %v", s.Addr())
	}
	h.opts.Port = addr.Port
	h.URL = "nats://" + net.JoinHostPort(suite.nodeIP, strconv.Itoa(addr.Port))
	if nc, err := nats.Connect(h.URL, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("the host's NATS takes a client without credentials")
	}
	nc, err := nats.Connect(h.URL, connect)
	if err != nil {
		t.Fatalf("connect to the host's NATS at %s: %v", h.URL, err)
	}
	t.Cleanup(nc.Close)
	if h.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(suite.repo, "deploy", "nats", streamFile))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var cfg jetstream.StreamConfig
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("deploy/nats/%s: %v", streamFile, err)
	}
	cfg.Replicas = 1
	if _, err := h.js.CreateStream(t.Context(), cfg); err != nil {
		t.Fatalf("create the stream of deploy/nats/%s: %v", streamFile, err)
	}
	if auth == authNodeCreds {
		// nats kv add PLEG_STATE --history 1 --replicas 1 --storage file
		// --marker-ttl 24h: a node's user may not create it.
		if _, err := h.js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{
			Bucket: "PLEG_STATE", History: 1, Replicas: 1, Storage: jetstream.FileStorage, LimitMarkerTTL: 24 * time.Hour,
		}); err != nil {
			t.Fatalf("create the state bucket as deploy/nats/README.md does: %v", err)
		}
	}
	return h
}

// projectNATS sets up NATS as deploy/nats/README.md's "NATS as a process"
// says for one server, with the project's own commands: pleg-bridge creds
// --init writes the account, nats-server.conf is read beside its
// resolver.conf (its listen address, ports and store moved to the node's
// IP, a free port and a temporary directory), and pleg-bridge creds --node
// mints the node's credentials as docs/deployment.md does, for the node
// kubectl names. It returns the server's options, the administrator's
// credentials file and the node's credentials.
func projectNATS(t *testing.T) (opts *server.Options, admin string, creds []byte) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "pleg-bridge")
	build := exec.Command("go", "build", "-o", bin, "./cmd/pleg-bridge")
	build.Dir = suite.repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pleg-bridge: %v\n%s", err, out)
	}
	account := filepath.Join(dir, "pleg-nats")
	if out, err := exec.Command(bin, "creds", "--init", account).CombinedOutput(); err != nil {
		t.Fatalf("pleg-bridge creds --init: %v\n%s", err, out)
	}
	// cp pleg-nats/resolver.conf deploy/nats/: the same, the other way
	// round, so that the checkout stays as it is.
	conf, err := os.ReadFile(filepath.Join(suite.repo, "deploy", "nats", "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(account, "nats-server.conf"), conf, 0o600); err != nil {
		t.Fatal(err)
	}
	if opts, err = server.ProcessConfigFile(filepath.Join(account, "nats-server.conf")); err != nil {
		t.Fatalf("nats-server -c deploy/nats/nats-server.conf: %v", err)
	}
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = suite.nodeIP, -1, 0, filepath.Join(dir, "js")

	node := strings.TrimSpace(string(kubectl(t, nil, "get", "nodes", "-o", "jsonpath={.items[0].metadata.name}")))
	out := filepath.Join(dir, "pleg-bridge.creds")
	if b, err := exec.Command(bin, "creds", "--signing-key", filepath.Join(account, "pleg-node.nk"), "--account-jwt", filepath.Join(account, "pleg.jwt"),
		"--node", node, "--out", out).CombinedOutput(); err != nil {
		t.Fatalf("pleg-bridge creds --node %s: %v\n%s", node, err, b)
	}
	if creds, err = os.ReadFile(out); err != nil {
		t.Fatal(err)
	}
	return opts, filepath.Join(account, "admin.creds"), creds
}

// operatorMode sets opts up for operator (JWT) mode: an operator, a system
// account and an account PLEG with JetStream, resolved from memory. It
// returns a credentials file of a user of PLEG.
func operatorMode(t *testing.T, opts *server.Options, key func(func() (nkeys.KeyPair, error)) (nkeys.KeyPair, string)) []byte {
	t.Helper()
	sign := func(c jwt.Claims, kp nkeys.KeyPair) string {
		s, err := c.Encode(kp)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	operator, operatorPub := key(nkeys.CreateOperator)
	opClaims := jwt.NewOperatorClaims(operatorPub)
	opClaims.Name = "pleg-k8s-e2e"
	op, err := jwt.DecodeOperatorClaims(sign(opClaims, operator))
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	_, sysPub := key(nkeys.CreateAccount)
	sysClaims := jwt.NewAccountClaims(sysPub)
	sysClaims.Name = "SYS"
	if err := resolver.Store(sysPub, sign(sysClaims, operator)); err != nil {
		t.Fatal(err)
	}
	account, accountPub := key(nkeys.CreateAccount)
	accClaims := jwt.NewAccountClaims(accountPub)
	accClaims.Name = "PLEG"
	accClaims.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	if err := resolver.Store(accountPub, sign(accClaims, operator)); err != nil {
		t.Fatal(err)
	}
	user, userPub := key(nkeys.CreateUser)
	userClaims := jwt.NewUserClaims(userPub)
	userClaims.Name = "pleg-bridge"
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(sign(userClaims, account), seed)
	if err != nil {
		t.Fatal(err)
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{op}
	opts.AccountResolver = resolver
	opts.SystemAccount = sysPub
	return creds
}
