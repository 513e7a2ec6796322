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

// Start runs the server until the test ends: an operator, a system account
// and the account PLEG with JetStream and two scoped signing keys, of role
// natsauth.Role and template natsauth.NodeTemplate(names) and of role
// natsauth.ReaderRole and template natsauth.ReaderTemplate(names), all
// resolved from memory. It fails the test if anything does not start.
func Start(t testing.TB, names natsauth.Names) *Server {
	t.Helper()
	dir := t.TempDir()
	operator := newKey(t, nkeys.CreateOperator)
	opPub := pub(t, operator)
	opClaims := jwt.NewOperatorClaims(opPub)
	opClaims.Name = "test-operator"
	opJWT := encode(t, opClaims, operator)
	opDecoded, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}

	resolver := &server.MemAccResolver{}
	sys := newKey(t, nkeys.CreateAccount)
	sysClaims := jwt.NewAccountClaims(pub(t, sys))
	sysClaims.Name = "SYS"
	if err := resolver.Store(pub(t, sys), encode(t, sysClaims, operator)); err != nil {
		t.Fatal(err)
	}

	account := newKey(t, nkeys.CreateAccount)
	accClaims := jwt.NewAccountClaims(pub(t, account))
	accClaims.Name = "PLEG"
	accClaims.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	signer := addScopedSigner(t, accClaims, natsauth.Role, natsauth.NodeTemplate(names))
	readerSigner := addScopedSigner(t, accClaims, natsauth.ReaderRole, natsauth.ReaderTemplate(names))
	accJWT := encode(t, accClaims, operator)
	if err := resolver.Store(pub(t, account), accJWT); err != nil {
		t.Fatal(err)
	}

	opts := &server.Options{
		Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: filepath.Join(dir, "js"),
		TrustedOperators: []*jwt.OperatorClaims{opDecoded},
		AccountResolver:  resolver,
		SystemAccount:    pub(t, sys),
	}
	s := publishtest.RunServer(t, opts)

	srv := &Server{
		URL: s.ClientURL(), Account: pub(t, account), SigningKey: signer,
		SigningKeyFile:       filepath.Join(dir, "pleg-node.nk"),
		ReaderSigningKey:     readerSigner,
		ReaderSigningKeyFile: filepath.Join(dir, "pleg-reader.nk"),
		AccountJWTFile:       filepath.Join(dir, "pleg.jwt"),
	}
	if err := os.WriteFile(srv.AccountJWTFile, []byte(accJWT+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeSeed(t, signer, srv.SigningKeyFile)
	writeSeed(t, readerSigner, srv.ReaderSigningKeyFile)

	admin := newKey(t, nkeys.CreateUser)
	adminClaims := jwt.NewUserClaims(pub(t, admin))
	adminClaims.Name = "admin"
	adminSeed, err := admin.Seed()
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(encode(t, adminClaims, account), adminSeed)
	if err != nil {
		t.Fatal(err)
	}
	srv.AdminCreds = filepath.Join(dir, "admin.creds")
	if err := os.WriteFile(srv.AdminCreds, creds, 0o600); err != nil {
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

// addScopedSigner adds a new scoped signing key of role, whose users get
// the permissions template, to claims, and returns the key.
func addScopedSigner(t testing.TB, claims *jwt.AccountClaims, role string, template jwt.Permissions) nkeys.KeyPair {
	t.Helper()
	signer := newKey(t, nkeys.CreateAccount)
	scope := jwt.NewUserScope()
	scope.Key = pub(t, signer)
	scope.Role = role
	scope.Template.Permissions = template
	claims.SigningKeys.AddScopedSigner(scope)
	return signer
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

func newKey(t testing.TB, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func pub(t testing.TB, kp nkeys.KeyPair) string {
	t.Helper()
	p, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func encode(t testing.TB, c jwt.Claims, kp nkeys.KeyPair) string {
	t.Helper()
	s, err := c.Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
