package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/natsauth"
)

func newCredsCommand(env commandEnv) *cobra.Command {
	var o credsOptions
	c := &cobra.Command{
		Use:   "creds",
		Short: "Mint a node's NATS credentials with the account's scoped signing key",
		Long: `The credentials file (user JWT and seed) names a new user after the node's
subject token (node-1.example.com: node-1_example_com). The scoped signing key
gives it its permissions: publish under <prefix>.<node>.>, write the node's
keys of the state bucket, the JetStream calls the bridge makes, and replies on
_INBOX_<node> only; the bridge must run with PLEG_NATS_INBOX_PREFIX=_INBOX_{node}.
Setting up the key once is described in deploy/nats/README.md.

--account-jwt (the account's JWT, e.g. from nsc describe account --raw) lets
creds check that the key is one of the account's scoped signing keys: a key
without a scope would give the user every permission of the account. With
--account (a public key) nothing proves the key belongs to that account or is
scoped: creds refuses only the account's own identity key and says on stderr
what it did not check.`,
		Example: `  pleg-bridge creds --signing-key pleg-node.nk --account-jwt pleg.jwt --node node-1.example.com --out node-1.creds
  pleg-bridge creds --signing-key /etc/pleg-signer/seed --account ACCOUNTPUBLICKEY --out /run/pleg/nats.creds   # node from PLEG_NODE_NAME
  pleg-bridge creds --signing-key pleg-node.nk --account-jwt pleg.jwt --node node-1 --expiry 720h`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runCreds(c.CommandPath(), o, env.stdout, env.stderr)
		},
	}
	f := c.Flags()
	f.StringVar(&o.signingKey, "signing-key", "", "file holding the seed (SA...) of the account's scoped signing key")
	f.StringVar(&o.account, "account", "", "public key (A...) of the account the signing key belongs to, taken on trust (--account-jwt checks the key)")
	f.StringVar(&o.accountJWT, "account-jwt", "", "file holding the account's JWT: names the account and proves the key is scoped (instead of --account)")
	f.StringVar(&o.node, "node", env.getenv("PLEG_NODE_NAME"), "node name, as PLEG_NODE_NAME gives it (default: $PLEG_NODE_NAME)")
	f.StringVar(&o.out, "out", "-", "file to write the credentials to, mode 0600 (-: stdout)")
	f.DurationVar(&o.expiry, "expiry", 0, "how long the credentials are valid (0: no expiry)")
	return c
}

// credsOptions are the flags of creds.
type credsOptions struct {
	signingKey, account, accountJWT, node, out string
	expiry                                     time.Duration
}

// runCreds mints the credentials of o.node and writes them to o.out. What
// it cannot check (the key against an account given by --account alone) it
// says on stderr.
func runCreds(cmd string, o credsOptions, stdout, stderr io.Writer) error {
	switch {
	case o.signingKey == "":
		return usageErrorf(cmd, "--signing-key is required")
	case o.node == "":
		return usageErrorf(cmd, "--node is required (or PLEG_NODE_NAME)")
	case (o.account == "") == (o.accountJWT == ""):
		return usageErrorf(cmd, "give one of --account and --account-jwt")
	case o.expiry < 0:
		return usageErrorf(cmd, "--expiry=%s must not be negative", o.expiry)
	}
	b, err := os.ReadFile(o.signingKey)
	if err != nil {
		return fmt.Errorf("read the signing key: %w", err)
	}
	key, err := jwt.ParseDecoratedNKey(b)
	if err != nil {
		return fmt.Errorf("read the signing key %s: %w", o.signingKey, err)
	}
	account := o.account
	if o.accountJWT != "" {
		if account, err = scopedAccount(o.accountJWT, key); err != nil {
			return err
		}
	} else if err := unverifiedAccount(cmd, account, key, stderr); err != nil {
		return err
	}
	creds, err := natsauth.Mint(natsauth.MintOptions{SigningKey: key, Account: account, Node: o.node, Expiry: o.expiry})
	if err != nil {
		return err
	}
	if o.out == "-" {
		_, err := stdout.Write(creds)
		return err
	}
	return writeSecretFile(o.out, creds)
}

// scopedAccount reads the account JWT in path and returns the account's
// public key, after checking that key is one of its scoped signing keys
// with role natsauth.Role.
func scopedAccount(path string, key nkeys.KeyPair) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the account JWT: %w", err)
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", fmt.Errorf("read the account JWT %s: %w", path, err)
	}
	ac, err := jwt.DecodeAccountClaims(token)
	if err != nil {
		return "", fmt.Errorf("read the account JWT %s: %w", path, err)
	}
	pub, err := key.PublicKey()
	if err != nil {
		return "", err
	}
	scope, ok := ac.SigningKeys.GetScope(pub)
	switch {
	case !ac.SigningKeys.Contains(pub):
		return "", fmt.Errorf("the signing key %s is not a signing key of account %s (%s)", pub, ac.Name, ac.Subject)
	case !ok || scope == nil:
		return "", fmt.Errorf("the signing key %s of account %s has no scope: its users would get every permission of the account; give it role %s and the template (deploy/nats/README.md)", pub, ac.Name, natsauth.Role)
	}
	if us, isUser := scope.(*jwt.UserScope); isUser && us.Role != natsauth.Role {
		return "", fmt.Errorf("the signing key %s of account %s has role %q, want %q", pub, ac.Name, us.Role, natsauth.Role)
	}
	return ac.Subject, nil
}

// unverifiedAccount checks what can be checked of a signing key for an
// account known only by its public key: it refuses the account's own
// identity key (its users would have every permission of the account), and
// writes on stderr that the rest was not checked. Whether the key is one of
// the account's signing keys, and its scope, are in the account's JWT only.
func unverifiedAccount(cmd, account string, key nkeys.KeyPair, stderr io.Writer) error {
	pub, err := key.PublicKey()
	if err != nil {
		return fmt.Errorf("read the signing key: %w", err)
	}
	if pub == account {
		return fmt.Errorf("the signing key is account %s's own identity key, not a scoped signing key: its users would get every permission of the account; use the key of role %s (deploy/nats/README.md)", account, natsauth.Role)
	}
	_, err = fmt.Fprintf(stderr, "%s: warning: signing key %s was NOT checked against account %s: only the account's JWT (--account-jwt) says whether the key is one of its signing keys and scoped to role %s. A key of another account mints credentials the server refuses; an unscoped key, credentials with every permission of the account.\n",
		cmd, pub, account, natsauth.Role)
	return err
}

// writeSecretFile writes b to path with mode 0600, through a temporary file
// renamed over it: a reader (the bridge starting beside an init container)
// sees the old file or the new one, never half of it.
func writeSecretFile(path string, b []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	_, werr := f.Write(b)
	if err := errors.Join(werr, f.Chmod(0o600), f.Close()); err != nil {
		return fmt.Errorf("write credentials %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	return nil
}
