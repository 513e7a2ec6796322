package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/natsauth"
)

// initFile is one file creds --init writes, and what it is for.
type initFile struct {
	name, what string
	data       func(*natsauth.Account) ([]byte, error)
}

// seedOf returns the seed, and a newline, of the key pick chooses.
func seedOf(pick func(*natsauth.Account) nkeys.KeyPair) func(*natsauth.Account) ([]byte, error) {
	return func(a *natsauth.Account) ([]byte, error) {
		seed, err := pick(a).Seed()
		return append(seed, '\n'), err
	}
}

// jwtOf returns the JWT, and a newline, that pick chooses.
func jwtOf(pick func(*natsauth.Account) string) func(*natsauth.Account) ([]byte, error) {
	return func(a *natsauth.Account) ([]byte, error) { return []byte(pick(a) + "\n"), nil }
}

// initFiles are the files of creds --init, in the order it lists them.
var initFiles = []initFile{
	{"resolver.conf", "include it in every nats-server's configuration (deploy/nats/nats-server.conf, nats-cluster.conf)",
		func(a *natsauth.Account) ([]byte, error) { return []byte(a.ServerConfig()), nil }},
	{"pleg.jwt", "the account's JWT: creds --account-jwt", jwtOf(func(a *natsauth.Account) string { return a.AccountJWT })},
	{"pleg-node.nk", "the nodes' scoped signing key: creds --signing-key (secret)", seedOf(func(a *natsauth.Account) nkeys.KeyPair { return a.NodeSigner })},
	{"pleg-reader.nk", "the readers' scoped signing key: creds --reader --signing-key (secret)", seedOf(func(a *natsauth.Account) nkeys.KeyPair { return a.ReaderSigner })},
	{"admin.creds", "the administrator, who creates the stream and the bucket (secret)",
		func(a *natsauth.Account) ([]byte, error) { return a.AdminCreds, nil }},
	{"sys.creds", "the system account's user: nats server report, ... (secret)",
		func(a *natsauth.Account) ([]byte, error) { return a.SystemCreds, nil }},
	{"pleg.nk", "the account's own key: it signs users with every permission of the account (secret; keep offline)", seedOf(func(a *natsauth.Account) nkeys.KeyPair { return a.Account })},
	{"operator.jwt", "the operator's JWT", jwtOf(func(a *natsauth.Account) string { return a.OperatorJWT })},
	{"operator.nk", "the operator's key: it signs the accounts (secret; keep offline)", seedOf(func(a *natsauth.Account) nkeys.KeyPair { return a.Operator })},
	{"sys.jwt", "the system account's JWT", jwtOf(func(a *natsauth.Account) string { return a.SystemJWT })},
	{"sys.nk", "the system account's key (secret; keep offline)", seedOf(func(a *natsauth.Account) nkeys.KeyPair { return a.System })},
}

// runCredsInit makes a new operator, system account and account with the
// two scoped signing keys (natsauth.NewAccount) for names, and writes them
// to dir, mode 0600, with the server configuration that resolves them. It
// refuses a directory that holds any of its files already: a second run
// must not replace the keys of a running set-up. It lists what it wrote,
// and the next steps, on stdout.
func runCredsInit(cmd, dir string, names natsauth.Names, stdout io.Writer) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creds --init: %w", err)
	}
	for _, f := range initFiles {
		if _, err := os.Lstat(filepath.Join(dir, f.name)); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("creds --init: %s exists already: a new account would replace its keys; give an empty directory", filepath.Join(dir, f.name))
		}
	}
	a, err := natsauth.NewAccount(natsauth.AccountOptions{Names: names})
	if err != nil {
		return err
	}
	for _, f := range initFiles {
		b, err := f.data(a)
		if err != nil {
			return fmt.Errorf("creds --init: %s: %w", f.name, err)
		}
		if err := writeSecretFile(filepath.Join(dir, f.name), b); err != nil {
			return err
		}
	}
	accPub, _ := a.Account.PublicKey()
	fmt.Fprintf(stdout, "%s: wrote operator %q, system account SYS and account PLEG (%s) with the signing keys of roles %s and %s to %s:\n",
		cmd, "pleg", accPub, natsauth.Role, natsauth.ReaderRole, dir)
	for _, f := range initFiles {
		fmt.Fprintf(stdout, "  %-15s %s\n", f.name, f.what)
	}
	stream, bucket := names.Stream, names.StateBucket
	if stream == "" {
		stream = "PLEG"
	}
	if bucket == "" {
		bucket = "PLEG_STATE"
	}
	_, err = fmt.Fprintf(stdout, `Next (deploy/nats/README.md):
  1. copy %[1]s beside deploy/nats/nats-server.conf (or nats-cluster.conf), which includes it
     (nats-server reads an include relative to the file that includes it), and start the servers
  2. nats --creds %[2]s stream add %[4]s --config deploy/nats/stream.json           # one server: stream-1.json
     nats --creds %[2]s kv add %[5]s --history 1 --replicas 3 --storage file --marker-ttl 24h   # one server: --replicas 1
  3. pleg-bridge creds --signing-key %[3]s --account-jwt %[6]s --node <node> --out <node>.creds
`, filepath.Join(dir, "resolver.conf"), filepath.Join(dir, "admin.creds"), filepath.Join(dir, "pleg-node.nk"), stream, bucket, filepath.Join(dir, "pleg.jwt"))
	return err
}
