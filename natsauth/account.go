package natsauth

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// AccountOptions say what NewAccount makes.
type AccountOptions struct {
	// Names are the names the signing keys' templates are written for.
	Names Names
	// Operator names the operator; empty means "pleg".
	Operator string
	// Account names the account of the stream; empty means "PLEG".
	Account string
}

// Account is what an operator sets up once for the bridges and their
// readers, without nsc: an operator, a system account, and the account
// that holds the stream, with JetStream and two scoped signing keys (role
// Role, template NodeTemplate; role ReaderRole, template ReaderTemplate),
// each JWT signed by the operator; and two users of the account's own key,
// the administrator (every permission of the account: it creates the
// stream and the bucket) and the system account's user (server
// monitoring).
type Account struct {
	Operator, System, Account nkeys.KeyPair
	NodeSigner, ReaderSigner  nkeys.KeyPair
	// OperatorJWT, SystemJWT and AccountJWT are the three JWTs, the
	// operator's self-signed.
	OperatorJWT, SystemJWT, AccountJWT string
	// AdminCreds and SystemCreds are credentials files (user JWT and
	// seed).
	AdminCreds, SystemCreds []byte
}

// NewAccount makes a new Account with fresh keys. Nothing is written: the
// caller keeps the seeds.
func NewAccount(opts AccountOptions) (*Account, error) {
	a := &Account{}
	var err error
	for _, k := range []struct {
		kp     *nkeys.KeyPair
		create func() (nkeys.KeyPair, error)
	}{
		{&a.Operator, nkeys.CreateOperator}, {&a.System, nkeys.CreateAccount}, {&a.Account, nkeys.CreateAccount},
		{&a.NodeSigner, nkeys.CreateAccount}, {&a.ReaderSigner, nkeys.CreateAccount},
	} {
		if *k.kp, err = k.create(); err != nil {
			return nil, fmt.Errorf("make the account: create a key: %w", err)
		}
	}
	opPub, _ := a.Operator.PublicKey()
	sysPub, _ := a.System.PublicKey()
	accPub, _ := a.Account.PublicKey()

	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = cmp.Or(opts.Operator, "pleg")
	oc.SystemAccount = sysPub
	if a.OperatorJWT, err = oc.Encode(a.Operator); err != nil {
		return nil, fmt.Errorf("make the account: encode the operator: %w", err)
	}

	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	if a.SystemJWT, err = sc.Encode(a.Operator); err != nil {
		return nil, fmt.Errorf("make the account: encode the system account: %w", err)
	}

	ac := jwt.NewAccountClaims(accPub)
	ac.Name = cmp.Or(opts.Account, "PLEG")
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	for _, s := range []struct {
		key      nkeys.KeyPair
		role     string
		template jwt.Permissions
	}{
		{a.NodeSigner, Role, NodeTemplate(opts.Names)},
		{a.ReaderSigner, ReaderRole, ReaderTemplate(opts.Names)},
	} {
		scope := jwt.NewUserScope()
		scope.Key, _ = s.key.PublicKey()
		scope.Role = s.role
		scope.Template.Permissions = s.template
		ac.SigningKeys.AddScopedSigner(scope)
	}
	if a.AccountJWT, err = ac.Encode(a.Operator); err != nil {
		return nil, fmt.Errorf("make the account: encode account %s: %w", ac.Name, err)
	}

	if a.AdminCreds, err = ownUser(a.Account, "pleg-admin"); err != nil {
		return nil, fmt.Errorf("make the account: the administrator: %w", err)
	}
	if a.SystemCreds, err = ownUser(a.System, "sys"); err != nil {
		return nil, fmt.Errorf("make the account: the system user: %w", err)
	}
	return a, nil
}

// ownUser returns the credentials file of a new user named name, issued by
// the account key itself: it has every permission of the account.
func ownUser(account nkeys.KeyPair, name string) ([]byte, error) {
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	upub, _ := user.PublicKey()
	useed, _ := user.Seed()
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	token, err := uc.Encode(account)
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, useed)
}

// ServerConfig returns the part of a nats-server configuration that trusts
// a's operator and resolves its two accounts from memory (resolver:
// MEMORY, the JWTs preloaded), for a server configuration to include.
// Accounts and their keys change only by running NewAccount again and
// restarting the servers with the new file; the users minted with the
// signing keys need no change of it.
func (a *Account) ServerConfig() string {
	sysPub, _ := a.System.PublicKey()
	accPub, _ := a.Account.PublicKey()
	name := "PLEG"
	if ac, err := jwt.DecodeAccountClaims(a.AccountJWT); err == nil {
		name = ac.Name
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# The operator, its system account SYS and account %s, as JWTs (pleg-bridge creds --init).\n", name)
	b.WriteString("# Included by the server's configuration; it holds public JWTs only, no seed.\n")
	fmt.Fprintf(&b, "operator: %s\n", a.OperatorJWT)
	fmt.Fprintf(&b, "system_account: %s\n", sysPub)
	b.WriteString("resolver: MEMORY\n")
	b.WriteString("resolver_preload: {\n")
	fmt.Fprintf(&b, "  # SYS\n  %s: %s\n", sysPub, a.SystemJWT)
	fmt.Fprintf(&b, "  # %s\n  %s: %s\n", name, accPub, a.AccountJWT)
	b.WriteString("}\n")
	return b.String()
}
