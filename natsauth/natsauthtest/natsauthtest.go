// Package natsauthtest runs an in-process NATS server in operator (JWT)
// mode with the account of natsauth: JetStream on, a scoped signing key
// whose template is natsauth.NodeTemplate, one whose template is
// natsauth.ReaderTemplate, and an administrator who may do everything
// (create the stream and the bucket, read what the nodes wrote).
package natsauthtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
)

// Server is a running operator-mode server and the keys of its account.
type Server struct {
	// URL is the server's client URL.
	URL string
	// Account is the public key of the account PLEG.
	Account string
	// SigningKey is the account's scoped signing key; SigningKeyFile holds
	// its seed, as an operator would give it to pleg-bridge creds.
	SigningKey     nkeys.KeyPair
	SigningKeyFile string
	// ReaderSigningKey is the account's scoped signing key of role
	// natsauth.ReaderRole; ReaderSigningKeyFile holds its seed.
	ReaderSigningKey     nkeys.KeyPair
	ReaderSigningKeyFile string
	// AccountJWTFile holds the account's JWT, as nsc describe account
	// --raw prints it.
	AccountJWTFile string
	// AdminCreds is a credentials file of a user of the account issued by
	// the account's own key, without permissions: it may do everything.
	AdminCreds string
}

// Start runs the server until the test ends, with natsauth.NewAccount's
// operator, system account and account PLEG: JetStream and two scoped
// signing keys, of role
// natsauth.Role and template natsauth.NodeTemplate(names) and of role
// natsauth.ReaderRole and template natsauth.ReaderTemplate(names), all
// resolved from memory. It fails the test if anything does not start.
func Start(t testing.TB, names natsauth.Names) *Server {
	t.Helper()
	dir := t.TempDir()
	a, err := natsauth.NewAccount(natsauth.AccountOptions{Names: names, Operator: "test-operator"})
	if err != nil {
		t.Fatal(err)
	}
	opClaims, err := jwt.DecodeOperatorClaims(a.OperatorJWT)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	for kp, token := range map[nkeys.KeyPair]string{a.System: a.SystemJWT, a.Account: a.AccountJWT} {
		if err := resolver.Store(pub(t, kp), token); err != nil {
			t.Fatal(err)
		}
	}
	opts := &server.Options{
		Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: filepath.Join(dir, "js"),
		TrustedOperators: []*jwt.OperatorClaims{opClaims},
		AccountResolver:  resolver,
		SystemAccount:    pub(t, a.System),
	}
	s := publishtest.RunServer(t, opts)

	srv := &Server{
		URL: s.ClientURL(), Account: pub(t, a.Account), SigningKey: a.NodeSigner,
		SigningKeyFile:       filepath.Join(dir, "pleg-node.nk"),
		ReaderSigningKey:     a.ReaderSigner,
		ReaderSigningKeyFile: filepath.Join(dir, "pleg-reader.nk"),
		AccountJWTFile:       filepath.Join(dir, "pleg.jwt"),
		AdminCreds:           filepath.Join(dir, "admin.creds"),
	}
	if err := os.WriteFile(srv.AccountJWTFile, []byte(a.AccountJWT+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeSeed(t, a.NodeSigner, srv.SigningKeyFile)
	writeSeed(t, a.ReaderSigner, srv.ReaderSigningKeyFile)
	if err := os.WriteFile(srv.AdminCreds, a.AdminCreds, 0o600); err != nil {
		t.Fatal(err)
	}
	return srv
}

// Mint writes the credentials of node, minted with the scoped signing key,
// to a file and returns its path.
func (s *Server) Mint(t testing.TB, node string) string {
	t.Helper()
	creds, err := natsauth.Mint(natsauth.MintOptions{SigningKey: s.SigningKey, Account: s.Account, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "nats.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// MintReader writes the credentials of a reader of namespaces that may
// consume groups' work streams, minted with the readers' scoped signing
// key, to a file, and returns its path and the inbox prefix the reader
// must connect with.
func (s *Server) MintReader(t testing.TB, namespaces, groups []string) (creds, inbox string) {
	t.Helper()
	b, err := natsauth.MintReader(natsauth.ReaderOptions{SigningKey: s.ReaderSigningKey, Account: s.Account, Namespaces: namespaces, Groups: groups})
	if err != nil {
		t.Fatal(err)
	}
	if inbox, err = natsauth.ReaderInboxPrefix(b); err != nil {
		t.Fatal(err)
	}
	creds = filepath.Join(t.TempDir(), "reader.creds")
	if err := os.WriteFile(creds, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return creds, inbox
}

// writeSeed writes the seed of kp, and a newline, to the file path, as an
// operator gives a key to pleg-bridge creds.
func writeSeed(t testing.TB, kp nkeys.KeyPair, path string) {
	t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
}

func pub(t testing.TB, kp nkeys.KeyPair) string {
	t.Helper()
	p, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
