package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
)

func newCredsCommand(env commandEnv) *cobra.Command {
	var o credsOptions
	c := &cobra.Command{
		Use:   "creds",
		Short: "Mint a node's or a namespace reader's NATS credentials with the account's scoped signing key",
		Long: `The credentials file (user JWT and seed) names a new user after the node's
subject token (node-1.example.com: node-1_example_com). The scoped signing key
gives it its permissions: publish under <prefix>.<node>.>, write the node's
keys of the state bucket, the JetStream calls the bridge makes, and replies on
_INBOX_<node> only, and no right to create or change the stream or the
bucket. A bridge that finds its node's credentials (PLEG_NATS_CREDS, the user
named by PLEG_NODE_NAME's token) sets PLEG_NATS_INBOX_PREFIX=_INBOX_{node} and
PLEG_STREAM_MANAGE=false itself; creds says so on stderr. Setting up the key
once is described in deploy/nats/README.md; --init makes the whole account.

With --reader, the credentials are a reader's, limited to the namespaces of
--namespace, minted with the readers' scoped signing key (role pleg-reader):
tail, replay and ps of those namespaces (-n), and their containers in the
state bucket, and nothing else: not another namespace, not the stream or the
bucket without a namespace, not events of the legacy subject layout, and no
durable group of its own. --group grants the work stream of a durable group
that an operator made for those namespaces. The reader receives replies on
_INBOX_<its public key> only: creds says which on stderr, to give to
--inbox-prefix.

--init DIR makes the account once, without nsc: a new operator, a system
account and the account PLEG with JetStream and both scoped signing keys
(templates for PLEG_SUBJECT_PREFIX, PLEG_STREAM and PLEG_STATE_BUCKET of the
environment, or the defaults), an administrator's credentials, and
resolver.conf, which nats-server's configuration includes to trust the
operator and resolve the accounts. DIR must not hold these files already.

--account-jwt (the account's JWT, from creds --init or nsc describe account --raw) lets
creds check that the key is one of the account's scoped signing keys, of the
role asked for: a key without a scope would give the user every permission of
the account. With --account (a public key) nothing proves the key belongs to
that account or is scoped: creds refuses only the account's own identity key
and says on stderr what it did not check.`,
		Example: `  pleg-bridge creds --init ./pleg-nats      # once: operator, accounts, signing keys, resolver.conf; no nsc
  pleg-bridge creds --signing-key pleg-nats/pleg-node.nk --account-jwt pleg-nats/pleg.jwt --node node-1.example.com --out node-1.creds
  pleg-bridge creds --signing-key pleg-node.nk --account-jwt pleg.jwt --node node-1.example.com --out node-1.creds
  pleg-bridge creds --signing-key /etc/pleg-signer/seed --account ACCOUNTPUBLICKEY --out /run/pleg/nats.creds   # node from PLEG_NODE_NAME
  pleg-bridge creds --signing-key pleg-node.nk --account-jwt pleg.jwt --node node-1 --expiry 720h
  pleg-bridge creds --reader --namespace shop,payments --signing-key pleg-reader.nk --account-jwt pleg.jwt --out shop.creds
  pleg-bridge creds --reader -n shop --group shop-billing --signing-key pleg-reader.nk --account-jwt pleg.jwt --expiry 2160h --out billing.creds`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			o.nodeSet = c.Flags().Changed("node")
			if c.Flags().Changed("init") {
				if err := o.checkInit(c.CommandPath(), c.Flags().NFlag()); err != nil {
					return err
				}
				return runCredsInit(c.CommandPath(), o.init, natsauth.Names{
					SubjectPrefix: env.getenv("PLEG_SUBJECT_PREFIX"), Stream: env.getenv("PLEG_STREAM"), StateBucket: env.getenv("PLEG_STATE_BUCKET"),
				}, env.stdout)
			}
			return runCreds(c.CommandPath(), o, env.stdout, env.stderr)
		},
	}
	f := c.Flags()
	f.StringVar(&o.init, "init", "", "make a new operator, system account and account with both scoped signing keys, without nsc, and write their keys, JWTs and the servers' resolver.conf to this directory")
	f.StringVar(&o.signingKey, "signing-key", "", "file holding the seed (SA...) of the account's scoped signing key (role pleg-node, or pleg-reader with --reader)")
	f.StringVar(&o.account, "account", "", "public key (A...) of the account the signing key belongs to, taken on trust (--account-jwt checks the key)")
	f.StringVar(&o.accountJWT, "account-jwt", "", "file holding the account's JWT: names the account and proves the key is scoped (instead of --account)")
	f.StringVar(&o.node, "node", env.getenv("PLEG_NODE_NAME"), "node name, as PLEG_NODE_NAME gives it (default: $PLEG_NODE_NAME)")
	f.BoolVar(&o.reader, "reader", false, "mint a reader's credentials, limited to --namespace, instead of a node's")
	f.StringSliceVarP(&o.namespaces, "namespace", "n", nil, "with --reader: the namespaces the reader may read (comma-separated or repeated)")
	f.StringSliceVar(&o.groups, "group", nil, "with --reader: durable groups whose work stream the reader may consume, each made by an operator with a filter within --namespace")
	f.StringVar(&o.out, "out", "-", "file to write the credentials to, mode 0600 (-: stdout)")
	f.DurationVar(&o.expiry, "expiry", 0, "how long the credentials are valid (0: no expiry)")
	return c
}

// credsOptions are the flags of creds.
type credsOptions struct {
	signingKey, account, accountJWT, node, out string
	init                                       string // --init: the directory
	nodeSet                                    bool   // --node given on the command line
	reader                                     bool
	namespaces, groups                         []string
	expiry                                     time.Duration
}

// role is the role of the scoped signing key the options need.
func (o credsOptions) role() string {
	if o.reader {
		return natsauth.ReaderRole
	}
	return natsauth.Role
}

// check reports the first usage error of o. The namespaces come first: a
// name that is not a namespace is refused, naming it, whatever else is
// wrong.
func (o credsOptions) check(cmd string) error {
	for _, ns := range o.namespaces {
		if err := consumer.ValidateNamespace(ns); err != nil {
			return cli.UsageErrorf(cmd, "--namespace: %w", err)
		}
	}
	for _, g := range o.groups {
		if err := natsauth.ValidateGroup(g); err != nil {
			return cli.UsageErrorf(cmd, "--group: %w", err)
		}
	}
	switch {
	case o.signingKey == "":
		return cli.UsageErrorf(cmd, "--signing-key is required")
	case !o.reader && (len(o.namespaces) > 0 || len(o.groups) > 0):
		return cli.UsageErrorf(cmd, "--namespace and --group are for a reader's credentials: add --reader")
	case o.reader && o.nodeSet:
		return cli.UsageErrorf(cmd, "--node is for a node's credentials, --reader for a reader's: give one")
	case o.reader && len(o.namespaces) == 0:
		return cli.UsageErrorf(cmd, "--namespace is required with --reader: a reader reads only the namespaces it is given")
	case !o.reader && o.node == "":
		return cli.UsageErrorf(cmd, "--node is required (or PLEG_NODE_NAME)")
	case (o.account == "") == (o.accountJWT == ""):
		return cli.UsageErrorf(cmd, "give one of --account and --account-jwt")
	case o.expiry < 0:
		return cli.UsageErrorf(cmd, "--expiry=%s must not be negative", o.expiry)
	}
	return nil
}

// checkInit reports a usage error if --init comes with another flag
// (nflags counts the flags given, --init included).
func (o credsOptions) checkInit(cmd string, nflags int) error {
	switch {
	case o.init == "":
		return cli.UsageErrorf(cmd, "--init needs a directory")
	case nflags > 1:
		return cli.UsageErrorf(cmd, "--init makes the account and its keys, and takes no other flag; mint credentials with a second creds command")
	}
	return nil
}

// runCreds mints the credentials of o.node, or of a reader of
// o.namespaces, and writes them to o.out. What it cannot check (the key
// against an account given by --account alone) it says on stderr, and so
// it does a reader's inbox prefix.
func runCreds(cmd string, o credsOptions, stdout, stderr io.Writer) error {
	if err := o.check(cmd); err != nil {
		return err
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
		if account, err = scopedAccount(o.accountJWT, key, o.role()); err != nil {
			return err
		}
	} else if err := unverifiedAccount(cmd, account, key, o.role(), stderr); err != nil {
		return err
	}
	var creds []byte
	if o.reader {
		creds, err = natsauth.MintReader(natsauth.ReaderOptions{
			SigningKey: key, Account: account, Namespaces: o.namespaces, Groups: o.groups, Expiry: o.expiry,
		})
	} else {
		creds, err = natsauth.Mint(natsauth.MintOptions{SigningKey: key, Account: account, Node: o.node, Expiry: o.expiry})
	}
	if err != nil {
		return err
	}
	if o.out == "-" {
		_, err = stdout.Write(creds)
	} else {
		err = writeSecretFile(o.out, creds)
	}
	if err != nil {
		return err
	}
	if !o.reader {
		return nodeSettings(cmd, o.node, stderr)
	}
	inbox, err := natsauth.ReaderInboxPrefix(creds)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stderr, "%s: the reader of %s receives replies on %s only: connect with --inbox-prefix %s (PLEG_NATS_INBOX_PREFIX; nats --inbox-prefix; nats.CustomInboxPrefix)\n",
		cmd, strings.Join(o.namespaces, ", "), inbox, inbox)
	return err
}

// nodeSettings writes on stderr what node's bridge needs beside its
// credentials, and that it sets both itself when it finds them.
func nodeSettings(cmd, node string, stderr io.Writer) error {
	_, err := fmt.Fprintf(stderr, "%s: node %s's bridge receives replies on %s only and may not create or change the stream or the state bucket: "+
		"with these credentials and PLEG_NODE_NAME=%s it sets PLEG_NATS_INBOX_PREFIX=_INBOX_{node} and PLEG_STREAM_MANAGE=false itself "+
		"(other clients: --inbox-prefix %s). Create the stream and the bucket once with an administrator's credentials (deploy/nats/README.md).\n",
		cmd, node, natsauth.InboxPrefix(node), node, natsauth.InboxPrefix(node))
	return err
}

// scopedAccount reads the account JWT in path and returns the account's
// public key, after checking that key is one of its scoped signing keys
// with role role.
func scopedAccount(path string, key nkeys.KeyPair, role string) (string, error) {
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
		return "", fmt.Errorf("the signing key %s of account %s has no scope: its users would get every permission of the account; give it role %s and the template (deploy/nats/README.md)", pub, ac.Name, role)
	}
	if us, isUser := scope.(*jwt.UserScope); isUser && us.Role != role {
		return "", fmt.Errorf("the signing key %s of account %s has role %q, want %q", pub, ac.Name, us.Role, role)
	}
	return ac.Subject, nil
}

// unverifiedAccount checks what can be checked of a signing key for an
// account known only by its public key: it refuses the account's own
// identity key (its users would have every permission of the account), and
// writes on stderr that the rest was not checked. Whether the key is one of
// the account's signing keys, and its scope, are in the account's JWT only.
func unverifiedAccount(cmd, account string, key nkeys.KeyPair, role string, stderr io.Writer) error {
	pub, err := key.PublicKey()
	if err != nil {
		return fmt.Errorf("read the signing key: %w", err)
	}
	if pub == account {
		return fmt.Errorf("the signing key is account %s's own identity key, not a scoped signing key: its users would get every permission of the account; use the key of role %s (deploy/nats/README.md)", account, role)
	}
	_, err = fmt.Fprintf(stderr, "%s: warning: signing key %s was NOT checked against account %s: only the account's JWT (--account-jwt) says whether the key is one of its signing keys and scoped to role %s. A key of another account mints credentials the server refuses; an unscoped key, credentials with every permission of the account.\n",
		cmd, pub, account, role)
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
