package natsauth

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// ReaderRole is the role name of the account's scoped signing key for
// readers (ReaderTemplate): what nsc shows, and what `nsc add user -K`
// takes.
const ReaderRole = "pleg-reader"

// The template's stand-ins, replaced by the server for each user: one
// subject per namespace or group tag of the user (a user without any gets
// none of those subjects), and the user's public key.
const (
	namespaceTemplate = "{{tag(" + NamespaceTag + ")}}"
	groupTemplate     = "{{tag(" + GroupTag + ")}}"
	subjectTemplate   = "{{subject()}}"
)

// The tags of a reader's user: NamespaceTag:<namespace> for each namespace
// it may read, GroupTag:<group> for each durable group whose work stream it
// may consume. `nsc add user --tag namespace:shop` sets the same.
const (
	NamespaceTag = "namespace"
	GroupTag     = "group"
)

// groupName is what a group name may hold (consumer.DurableOptions.Name),
// in lower case: NATS lower-cases the tags nsc writes, so a group named in
// upper case could not be granted the same way by hand.
var groupName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// ReaderTemplate returns the permissions of the readers' scoped signing
// key: what a reader of the namespaces its user's tags name may do,
// {{tag(namespace)}} standing for each of them, {{tag(group)}} for each
// durable group it is granted and {{subject()}} for its public key.
//
// Per namespace, a reader may create consumers on the stream whose filter
// is in that namespace (<prefix>.*.<namespace>.>, part of the API subject,
// so the server checks it: consumer.Subscribe and consumer.Replay with
// Filter.Namespace), and on the state bucket's stream whose filter is in
// that namespace's keys ($KV.<bucket>.*.<namespace>.>: consumer.ListState
// and WatchState with StateFilter.Namespace), get the last entry of such a
// key, and subscribe to the namespace's events without JetStream. It may
// read the stream's and the bucket's info, pull from, delete and answer
// the flow control of consumers, and receive replies on
// _INBOX_<its public key> only. Per granted group, it may consume that
// group's existing work stream (<stream>_<group>) as consumer.Consume
// does.
//
// It may not create a consumer without a namespace filter or with
// another namespace's, read events of the legacy layout (their subjects
// carry no namespace, so no permission can tell them apart), get a
// message by sequence (STREAM.MSG.GET and DIRECT.GET of the stream take
// the subject in the request body), write anything, or create, change or
// delete a stream: a durable group's work stream must be made by an
// operator, because a stream's sources are in the request body, beyond
// the reach of permissions, and a reader that may create one could source
// every namespace.
//
// What is wider than its namespaces: the stream's info, whose request may
// ask for the stored subjects and their counts (so a reader may learn the
// node names, namespaces and pod UIDs that have events, never the events);
// and next-message and delete requests, which name a consumer, not a
// filter, so a reader may pull from or delete a consumer of the stream
// whose name it knows (ordered consumers have random names; do not give
// durable consumers of the stream names a reader can guess).
func ReaderTemplate(names Names) jwt.Permissions {
	return readerPermissions(names.withDefaults(), []string{namespaceTemplate}, []string{groupTemplate}, inboxPrefix+subjectTemplate)
}

// ReaderPermissions returns ReaderTemplate's permissions written out for
// one user that carries its own: a static user of the server's
// configuration (deploy/nats/accounts.conf), or a user JWT issued by an
// account key without a scope. namespaces are the namespaces it may read
// (at least one), groups the durable groups whose work stream it may
// consume, and inbox the inbox prefix it must connect with
// (nats.CustomInboxPrefix), a literal subject no other user's inboxes
// start with. Invalid namespaces and groups are refused, naming them.
func ReaderPermissions(names Names, namespaces, groups []string, inbox string) (jwt.Permissions, error) {
	if err := checkReader(namespaces, groups); err != nil {
		return jwt.Permissions{}, err
	}
	if inbox == "" || strings.ContainsAny(inbox, "*> \t\r\n") || strings.HasPrefix(inbox, ".") || strings.HasSuffix(inbox, ".") || strings.Contains(inbox, "..") {
		return jwt.Permissions{}, fmt.Errorf("inbox prefix %q is not a literal subject", inbox)
	}
	return readerPermissions(names.withDefaults(), namespaces, groups, inbox), nil
}

// readerPermissions writes the permissions of a reader of namespaces and
// groups, with replies on inbox: literal values or the template's
// stand-ins.
func readerPermissions(n Names, namespaces, groups []string, inbox string) jwt.Permissions {
	kv := "KV_" + n.StateBucket
	archive := schemas.ArchiveName(n.Stream)
	var p jwt.Permissions
	p.Pub.Allow.Add(
		"$JS.API.STREAM.INFO."+n.Stream,
		"$JS.API.CONSUMER.MSG.NEXT."+n.Stream+".*",
		"$JS.API.CONSUMER.DELETE."+n.Stream+".*",
		"$JS.API.STREAM.INFO."+archive,
		"$JS.API.CONSUMER.MSG.NEXT."+archive+".*",
		"$JS.API.CONSUMER.DELETE."+archive+".*",
		"$JS.API.STREAM.INFO."+kv,
		"$JS.API.CONSUMER.DELETE."+kv+".*",
		"$JS.FC."+kv+".>",
	)
	for _, ns := range namespaces {
		p.Pub.Allow.Add(
			"$JS.API.CONSUMER.CREATE."+n.Stream+".*."+n.SubjectPrefix+".*."+ns+".>",
			"$JS.API.CONSUMER.CREATE."+archive+".*."+n.SubjectPrefix+".*."+ns+".>",
			"$JS.API.CONSUMER.CREATE."+kv+".*.$KV."+n.StateBucket+".*."+ns+".>",
			"$JS.API.DIRECT.GET."+kv+".$KV."+n.StateBucket+".*."+ns+".>",
		)
		p.Sub.Allow.Add(n.SubjectPrefix + ".*." + ns + ".>")
	}
	for _, g := range groups {
		ws := n.Stream + "_" + g
		p.Pub.Allow.Add(
			"$JS.API.STREAM.INFO."+ws,
			"$JS.API.CONSUMER.CREATE."+ws+".>",
			"$JS.API.CONSUMER.MSG.NEXT."+ws+".*",
			"$JS.ACK."+ws+".>",
		)
	}
	p.Sub.Allow.Add(inbox + ".>")
	return p
}

// checkReader checks a reader's namespaces and groups: at least one
// namespace, each one valid (consumer.ValidateNamespace, whose error names
// it), and group names that can be tags.
func checkReader(namespaces, groups []string) error {
	if len(namespaces) == 0 {
		return errors.New("no namespace: a reader reads only the namespaces it is given")
	}
	for _, ns := range namespaces {
		if err := consumer.ValidateNamespace(ns); err != nil {
			return err
		}
	}
	for _, g := range groups {
		if err := ValidateGroup(g); err != nil {
			return err
		}
	}
	return nil
}

// ValidateGroup reports an error, naming name, if it cannot be granted as
// a durable group (ReaderOptions.Groups): it must be a group name
// (consumer.DurableOptions.Name) in lower case, as a user's tag holds it.
func ValidateGroup(name string) error {
	if !groupName.MatchString(name) {
		return fmt.Errorf("group name %q: want 1 to 64 lower-case letters, digits, '-' or '_'", name)
	}
	return nil
}

// ReaderOptions say whose reader credentials MintReader issues, and with
// which key.
type ReaderOptions struct {
	// SigningKey is the account's scoped signing key of role ReaderRole
	// (seed SA...), whose template is ReaderTemplate. Required.
	SigningKey nkeys.KeyPair
	// Account is the public key of the account (A...) the signing key
	// belongs to. Required.
	Account string
	// Namespaces are the Kubernetes namespaces the reader may read; at
	// least one.
	Namespaces []string
	// Groups are durable groups (consumer.DurableOptions.Name) whose work
	// stream the reader may consume. An operator makes each group, with a
	// filter within Namespaces: the server cannot tie a group to a
	// namespace, so nothing checks that.
	Groups []string
	// Expiry is how long the credentials are valid; 0 means no expiry.
	Expiry time.Duration
}

// MintReader returns the credentials file (user JWT and seed) of a new
// reader: a fresh user key, issued by the readers' scoped signing key with
// no permissions of its own and one tag per namespace and group, which the
// key's template turns into its permissions. The user is named
// "reader:<namespaces>". The reader must connect with the inbox prefix
// ReaderInboxPrefix gives. Namespaces are checked first, each with
// consumer.ValidateNamespace, whose error names the bad one. Each call
// makes a new user; earlier credentials stay valid until they expire or
// the account revokes them.
func MintReader(opts ReaderOptions) ([]byte, error) {
	if err := checkReader(opts.Namespaces, opts.Groups); err != nil {
		return nil, fmt.Errorf("mint reader credentials: %w", err)
	}
	namespaces, groups := dedup(opts.Namespaces), dedup(opts.Groups)
	tags := make([]string, 0, len(namespaces)+len(groups))
	for _, ns := range namespaces {
		tags = append(tags, NamespaceTag+":"+ns)
	}
	for _, g := range groups {
		tags = append(tags, GroupTag+":"+g)
	}
	creds, err := issue(opts.SigningKey, opts.Account, "reader:"+strings.Join(namespaces, ","), opts.Expiry, tags)
	if err != nil {
		return nil, fmt.Errorf("mint reader credentials: %w", err)
	}
	return creds, nil
}

// dedup returns list without repeated values, in the order of first
// appearance.
func dedup(list []string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// ReaderInboxPrefix returns the inbox prefix ReaderTemplate lets the user
// of creds (a credentials file) subscribe to: _INBOX_<its public key>. The
// reader must connect with it (nats.CustomInboxPrefix, nats
// --inbox-prefix), or no reply reaches it.
func ReaderInboxPrefix(creds []byte) (string, error) {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return "", fmt.Errorf("read credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return "", fmt.Errorf("read credentials: %w", err)
	}
	return inboxPrefix + uc.Subject, nil
}

// ReaderNamespaces returns the namespaces a reader's credentials are
// limited to, from its user's NamespaceTag tags; none for credentials of
// any other user (a node's, or one not minted by this package).
func ReaderNamespaces(creds []byte) ([]string, error) {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	var out []string
	for _, tag := range uc.Tags {
		if ns, ok := strings.CutPrefix(tag, NamespaceTag+":"); ok {
			out = append(out, ns)
		}
	}
	return out, nil
}
