package natsauth

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Role is the role name of the scoped signing key in the account: what nsc
// shows, and what `nsc add user -K` takes.
const Role = "pleg-node"

// nameTemplate is replaced by the server with the user's name: the node's
// subject token.
const nameTemplate = "{{name()}}"

// inboxPrefix is the start of a node's reply subjects. It is not _INBOX:
// a user allowed to subscribe to _INBOX.> receives the replies of every
// other user of the account, JetStream acks and API answers included.
const inboxPrefix = "_INBOX_"

// Names are the names the permissions are written for; an empty field takes
// the default of schemas. They must match the bridge's PLEG_SUBJECT_PREFIX,
// PLEG_STREAM and PLEG_STATE_BUCKET.
type Names struct {
	SubjectPrefix, Stream, StateBucket string
}

func (n Names) withDefaults() Names {
	if n.SubjectPrefix == "" {
		n.SubjectPrefix = schemas.DefaultSubjectPrefix
	}
	if n.Stream == "" {
		n.Stream = schemas.DefaultStream
	}
	if n.StateBucket == "" {
		n.StateBucket = schemas.DefaultStateBucket
	}
	return n
}

// NodeTemplate returns the permissions of the scoped signing key: what
// every node's bridge may do, {{name()}} standing for its node token.
//
// A node may publish its events (<prefix>.<node>.>) and write its keys of
// the state bucket ($KV.<bucket>.<node>.>); read the stream's and the
// bucket's info (/readyz, the set-up with PLEG_STREAM_MANAGE=false); read
// back what it stored itself: consumers filtered to its own subjects only
// (the publisher's reconcile after a restart, on the stream; the state
// writer's watch of its keys, on the bucket's stream), their next-message
// requests, deletion and flow control, and the last message of one of its
// own subjects (the check before a late retry); receive replies on its
// own inbox prefix only; and hear of its stream's leader elections
// (leaderElectedAdvisory).
//
// It may not create, change, purge or delete the stream or the bucket: a
// node that may update the stream can shorten its max age and so delete
// every other node's events. The operator creates both once
// (PLEG_STREAM_MANAGE=false on the nodes).
//
// Two grants are wider than one node: the next-message and delete requests
// name a consumer, not a filter, so a node may pull from or delete another
// consumer of the stream whose name it knows; and
// STREAM.MSG.GET of the stream (used for the check when the stream does
// not allow direct gets) takes its subject in the request body, so it reads
// any message. Both let a node read or disturb, neither lets it publish as
// another node.
func NodeTemplate(names Names) jwt.Permissions {
	n := names.withDefaults()
	kv := "KV_" + n.StateBucket
	var p jwt.Permissions
	p.Pub.Allow.Add(
		n.SubjectPrefix+"."+nameTemplate+".>",
		"$KV."+n.StateBucket+"."+nameTemplate+".>",
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO."+n.Stream,
		"$JS.API.CONSUMER.CREATE."+n.Stream+".*."+n.SubjectPrefix+"."+nameTemplate+".>",
		"$JS.API.CONSUMER.MSG.NEXT."+n.Stream+".*",
		"$JS.API.CONSUMER.DELETE."+n.Stream+".*",
		"$JS.API.DIRECT.GET."+n.Stream+"."+n.SubjectPrefix+"."+nameTemplate+".>",
		"$JS.API.STREAM.MSG.GET."+n.Stream,
		"$JS.API.STREAM.INFO."+kv,
		"$JS.API.CONSUMER.CREATE."+kv+".*.$KV."+n.StateBucket+"."+nameTemplate+".>",
		"$JS.API.CONSUMER.DELETE."+kv+".*",
		"$JS.FC."+kv+".>",
	)
	p.Sub.Allow.Add(
		inboxPrefix+nameTemplate+".>",
		// The bridge listens for its stream's leader elections to check,
		// after a new leader took over, that what was acknowledged is still
		// stored (and republishes what is not). The advisory says only
		// which server leads the stream, nothing of any node's events.
		leaderElectedAdvisory(n.Stream),
	)
	return p
}

// leaderElectedAdvisory returns the subject on which JetStream announces a
// new leader of stream: what NodeTemplate lets a node subscribe to.
func leaderElectedAdvisory(stream string) string {
	return "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED." + stream
}

// UserName returns the user name of node's credentials: its subject token
// (schemas.EncodeToken), which the template puts in the subjects. A node
// name whose subject token and state key token differ (a byte outside
// [A-Za-z0-9.-], which no Kubernetes node name has) is refused: one name
// cannot stand for both.
func UserName(node string) (string, error) {
	if node == "" {
		return "", errors.New("node name is empty")
	}
	tok := schemas.EncodeToken(node)
	if tok != schemas.EncodeKeyToken(node) {
		return "", fmt.Errorf("node name %q has bytes outside [A-Za-z0-9.-]: its subject token %q and state key token %q differ, and one user name cannot stand for both",
			node, tok, schemas.EncodeKeyToken(node))
	}
	return tok, nil
}

// InboxPrefix returns the inbox prefix the template lets node's bridge
// subscribe to: _INBOX_<node token>. The bridge must use it
// (nats.CustomInboxPrefix; PLEG_NATS_INBOX_PREFIX=_INBOX_{node}), or no
// reply reaches it.
func InboxPrefix(node string) string { return inboxPrefix + schemas.EncodeToken(node) }

// MintOptions say whose credentials Mint issues, and with which key.
type MintOptions struct {
	// SigningKey is the account's scoped signing key (seed SA...), whose
	// template is NodeTemplate. Required.
	SigningKey nkeys.KeyPair
	// Account is the public key of the account (A...) the signing key
	// belongs to. Required.
	Account string
	// Node is the node's name, as PLEG_NODE_NAME gives it. Required.
	Node string
	// Expiry is how long the credentials are valid; 0 means no expiry.
	Expiry time.Duration
}

// Mint returns the credentials file (user JWT and seed) of a new user for
// opts.Node: a fresh user key, named by the node's token, issued by the
// scoped signing key, with no permissions of its own. Each call makes a new
// user; earlier credentials of the node stay valid until they expire or the
// account revokes them.
func Mint(opts MintOptions) ([]byte, error) {
	name, err := UserName(opts.Node)
	if err != nil {
		return nil, fmt.Errorf("mint credentials: %w", err)
	}
	creds, err := issue(opts.SigningKey, opts.Account, name, opts.Expiry, nil)
	if err != nil {
		return nil, fmt.Errorf("mint credentials: %w", err)
	}
	return creds, nil
}

// issue returns the credentials file of a new user key, named name and
// tagged tags, issued by the scoped signing key for account, with no
// permissions of its own.
func issue(key nkeys.KeyPair, account, name string, expiry time.Duration, tags []string) ([]byte, error) {
	if key == nil {
		return nil, errors.New("no signing key")
	}
	if pub, err := key.PublicKey(); err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, errors.New("the signing key is not an account signing key (seed SA...)")
	}
	if !nkeys.IsValidPublicAccountKey(account) {
		return nil, fmt.Errorf("account %q is not an account public key (A...)", account)
	}
	if expiry < 0 {
		return nil, fmt.Errorf("expiry %s is negative", expiry)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("create user key: %w", err)
	}
	upub, err := user.PublicKey()
	if err != nil {
		return nil, err
	}
	useed, err := user.Seed()
	if err != nil {
		return nil, err
	}
	token, err := jwt.IssueUserJWT(key, account, upub, name, expiry, tags...)
	if err != nil {
		return nil, fmt.Errorf("issue user JWT: %w", err)
	}
	return jwt.FormatUserConfig(token, useed)
}
