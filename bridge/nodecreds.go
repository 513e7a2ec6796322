package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/pleg-bridge/pleg-bridge/natsauth"
)

// withNodeCredentials returns opts with the settings a node's own
// credentials need, when opts.NATS.Creds holds them (scopedUser, named by
// the node's token): replies on
// the node's inbox prefix (natsauth.InboxPrefix) unless opts name one, and
// the stream and the state bucket left to the operator (Stream.Manage
// false), since such a user may not create or change either. It logs what
// it changed, and warns of a scoped user named for another node (one
// node's credentials given to every node). Other credentials, and a file
// that cannot be read (the connection reports that), leave opts as they
// are.
func withNodeCredentials(opts Options) Options {
	if opts.NATS.Creds == "" {
		return opts
	}
	user, scoped := scopedUser(opts.NATS.Creds)
	own, err := natsauth.UserName(opts.Node)
	if !scoped || err != nil {
		return opts
	}
	if user != own {
		// One Secret for every node of a DaemonSet: fine for a shared
		// user, not for a node's own credentials.
		opts.Logger.Warn("the NATS credentials are of a user issued by a signing key and named for another node: if pleg-bridge creds --node made them, they are that node's, and the server refuses this node's events; each node needs its own (deploy/nats/README.md, \"Wiring the DaemonSet\")",
			"creds", opts.NATS.Creds, "creds_user", user, "node", opts.Node, "node_user", own)
		return opts
	}
	var set []any
	if opts.NATS.InboxPrefix == "" {
		opts.NATS.InboxPrefix = natsauth.InboxPrefix(opts.Node)
		set = append(set, "inbox_prefix", opts.NATS.InboxPrefix)
	}
	if opts.Stream.Manage {
		opts.Stream.Manage = false
		set = append(set, "stream_manage", false)
	}
	if len(set) > 0 {
		opts.Logger.Info("the NATS credentials are this node's own user (pleg-bridge creds --node): it receives replies on its inbox prefix only, and the stream and the state bucket are the operator's to create",
			append(set, "creds", opts.NATS.Creds)...)
	}
	return opts
}

// scopedUser returns the name of the user in the credentials file path,
// and whether it is issued as natsauth.Mint (pleg-bridge creds --node) and
// `nsc add user -K pleg-node` issue a node's user: by a signing key of its
// account (not the account's own key), without permissions of its own (the
// key's template gives them). A node's user is named by the node's subject
// token (natsauth.UserName).
func scopedUser(path string) (name string, scoped bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", false
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return "", false
	}
	return uc.Name, uc.IssuerAccount != "" && uc.HasEmptyPermissions()
}

// refusals remembers what the NATS server refused the bridge that one of
// its settings fixes, so that /readyz and the retries' log lines say which
// setting: a subscription to its reply inbox (PLEG_NATS_INBOX_PREFIX), and
// the creation or update of the stream or the bucket
// (PLEG_STREAM_MANAGE). The server reports a refusal once, asynchronously;
// the requests that needed it only time out. The methods are safe for
// concurrent use, and on a nil *refusals (nothing remembered).
type refusals struct {
	node, inbox, stream, bucket string

	mu      sync.Mutex
	inboxed string // the advice for a refused inbox; guarded by mu
	managed string // the advice for a refused set-up; guarded by mu
}

// newRefusals returns the refusals of a bridge run with opts (defaults
// applied).
func newRefusals(opts Options) *refusals {
	inbox := opts.NATS.InboxPrefix
	if inbox == "" {
		inbox = nats.InboxPrefix[:len(nats.InboxPrefix)-1] // _INBOX
	}
	r := &refusals{node: opts.Node, inbox: inbox, stream: opts.Stream.Name}
	if opts.StateBucket != "" {
		r.bucket = "KV_" + opts.StateBucket
	}
	return r
}

// violation matches the server's text of a permissions violation, as
// nats.go passes it to the error handler.
var violation = regexp.MustCompile(`Permissions Violation for (Subscription|Publish) to "([^"]+)"`)

// record remembers err if it is a refusal a setting fixes, and returns the
// advice: which setting, and why. It returns "" for any other error.
func (r *refusals) record(err error) string {
	if r == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return ""
	}
	m := violation.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	verb, subject := m[1], m[2]
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case verb == "Subscription" && strings.HasPrefix(strings.ToLower(subject), strings.ToLower(r.inbox)+"."):
		r.inboxed = r.inboxAdvice(subject)
		return r.inboxed
	case verb == "Publish" && r.setUp(subject):
		r.managed = fmt.Sprintf("the NATS server refuses the bridge's %s: its user may not create or change the stream or the state bucket (per-node credentials may not); set PLEG_STREAM_MANAGE=false and create both once (deploy/nats/README.md, \"Creating the stream yourself\")", subject)
		return r.managed
	}
	return ""
}

// inboxAdvice says what to set when the subscription to subject, under the
// bridge's inbox prefix, is refused.
func (r *refusals) inboxAdvice(subject string) string {
	own := natsauth.InboxPrefix(r.node)
	if r.inbox == own {
		return fmt.Sprintf("the NATS server refuses the bridge's subscription to its replies (%s) under this node's own inbox prefix %s: the credentials are not node %s's; mint them with pleg-bridge creds --node %s",
			subject, own, r.node, r.node)
	}
	return fmt.Sprintf("the NATS server refuses the bridge's subscription to its replies (%s), so no JetStream call is answered: its user may receive replies under its own prefix only; set PLEG_NATS_INBOX_PREFIX=_INBOX_{node} for per-node credentials (pleg-bridge creds --node), or the prefix the user is given",
		subject)
}

// setUp reports whether subject is the creation or update of the stream
// or the bucket.
func (r *refusals) setUp(subject string) bool {
	for _, op := range []string{"CREATE", "UPDATE"} {
		for _, s := range []string{r.stream, r.bucket} {
			if s != "" && subject == "$JS.API.STREAM."+op+"."+s {
				return true
			}
		}
	}
	return false
}

// advice returns the advice for what was refused since the last connect,
// the inbox first; "" if nothing was.
func (r *refusals) advice() string {
	if r == nil {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.inboxed != "" && r.managed != "":
		return r.inboxed + "; and " + r.managed
	case r.inboxed != "":
		return r.inboxed
	}
	return r.managed
}

// reset forgets what was refused, at a disconnect: the next connection
// subscribes again, and the server reports again what it still refuses.
func (r *refusals) reset() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.inboxed, r.managed = "", ""
	r.mu.Unlock()
}

// logRefusal logs err at Error with its advice if it is a refusal a
// setting fixes, and reports whether it was.
func (r *refusals) logRefusal(err error, log *slog.Logger) bool {
	advice := r.record(err)
	if advice == "" {
		return false
	}
	log.Error("the NATS server refuses the bridge a call it needs", "err", err, "fix", advice)
	return true
}
