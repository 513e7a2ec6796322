package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
)

// natsFlags are the flags of the commands that read from NATS (tail,
// replay, ps, and the completion of their names): where the server is and
// how to authenticate, with defaults from the PLEG_NATS_* environment the
// agent itself reads, so that a shell in the bridge's pod, or one with the
// same variables, connects as the bridge does.
type natsFlags struct {
	url  string
	auth bridge.NATSOptions
	// context names the nats CLI context to fill in what neither a flag
	// nor a PLEG_NATS_* variable sets; "" means the selected one, if any.
	context string
	// Set by addNATSFlags: what the context may not override.
	fs     *pflag.FlagSet
	getenv func(string) string
	// contextUsed names the context connect applied, for messages.
	contextUsed string
	// resolved is set once connect has applied the context and read the
	// credentials: a command that connects twice (tail and its hint)
	// reads those files once.
	resolved bool
	// stream is the event stream of the command, whose legacy-layout look
	// a reader limited to namespaces is refused (consumer.LegacyProbeRefused).
	stream string
	// namespaces are those the credentials are limited to (a reader's from
	// pleg-bridge creds --reader), set by connect; none for others.
	namespaces []string
}

// addNATSFlags defines the NATS flags on fs.
func addNATSFlags(fs *pflag.FlagSet, getenv func(string) string) *natsFlags {
	f := &natsFlags{fs: fs, getenv: getenv}
	fs.StringVar(&f.context, "context", getenv("NATS_CONTEXT"), "nats CLI context to connect with (env NATS_CONTEXT; default: the context selected with 'nats context select', if any); flags and PLEG_NATS_* variables override its settings")
	fs.StringVar(&f.url, "nats-url", cmp.Or(getenv("PLEG_NATS_URL"), defaultNATSURL), "NATS server URL (env PLEG_NATS_URL)")
	fs.StringVar(&f.auth.Creds, "creds", getenv("PLEG_NATS_CREDS"), "NATS credentials file, JWT and NKey seed, as pleg-bridge creds writes (env PLEG_NATS_CREDS)")
	fs.StringVar(&f.auth.NKeySeed, "nkey", getenv("PLEG_NATS_NKEY_SEED"), "NATS NKey seed file (env PLEG_NATS_NKEY_SEED)")
	fs.StringVar(&f.auth.User, "user", getenv("PLEG_NATS_USER"), "NATS user name (env PLEG_NATS_USER)")
	fs.StringVar(&f.auth.Password, "password", getenv("PLEG_NATS_PASSWORD"), "NATS password (env PLEG_NATS_PASSWORD; the flag shows in ps, prefer the variable)")
	fs.StringVar(&f.auth.Token, "token", getenv("PLEG_NATS_TOKEN"), "NATS authentication token (env PLEG_NATS_TOKEN)")
	fs.StringVar(&f.auth.TokenFile, "token-file", getenv("PLEG_NATS_TOKEN_FILE"), "file holding the NATS authentication token (env PLEG_NATS_TOKEN_FILE)")
	fs.StringVar(&f.auth.TLSCA, "tls-ca", getenv("PLEG_NATS_TLS_CA"), "CA certificate file to verify the NATS server (env PLEG_NATS_TLS_CA)")
	fs.StringVar(&f.auth.TLSCert, "tls-cert", getenv("PLEG_NATS_TLS_CERT"), "client certificate file for NATS mutual TLS (env PLEG_NATS_TLS_CERT)")
	fs.StringVar(&f.auth.TLSKey, "tls-key", getenv("PLEG_NATS_TLS_KEY"), "client key file for NATS mutual TLS (env PLEG_NATS_TLS_KEY)")
	fs.StringVar(&f.auth.InboxPrefix, "inbox-prefix", "", "prefix of the subjects replies come back on, if the credentials allow only their own (default _INBOX)")
	return f
}

// check reports flags that cannot go together, naming them.
func (f *natsFlags) check() error {
	var errs []error
	if f.auth.Token != "" && f.auth.TokenFile != "" {
		errs = append(errs, errors.New("--token and --token-file (PLEG_NATS_TOKEN, PLEG_NATS_TOKEN_FILE) cannot both be set"))
	}
	if (f.auth.TLSCert == "") != (f.auth.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key (PLEG_NATS_TLS_CERT, PLEG_NATS_TLS_KEY) go together"))
	}
	if f.auth.Creds != "" && f.auth.NKeySeed != "" {
		errs = append(errs, errors.New("--creds and --nkey (PLEG_NATS_CREDS, PLEG_NATS_NKEY_SEED) cannot both be set: a credentials file holds its own NKey seed"))
	}
	return errors.Join(errs...)
}

// errRefused wraps a permission violation the NATS server reported.
var errRefused = errors.New("NATS refused it: the credentials do not allow it")

// connect connects to the flags' server under the client name name, with
// extra options after the flags' own. The server reports a permission
// violation on its own, not as the answer to the request it refused, which
// would otherwise wait out its timeout: the returned context, derived from
// ctx, is canceled with the violation as its cause (see refusal), and when
// the connection closes.
func (f *natsFlags) connect(ctx context.Context, name string, extra ...nats.Option) (context.Context, *nats.Conn, jetstream.JetStream, error) {
	if !f.resolved {
		if err := f.applyContext(); err != nil {
			return ctx, nil, nil, err
		}
		if err := f.check(); err != nil {
			return ctx, nil, nil, err
		}
		if err := f.readerScope(); err != nil {
			return ctx, nil, nil, err
		}
		f.resolved = true
	}
	auth, err := f.auth.ClientOptions(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return ctx, nil, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	opts := append([]nats.Option{
		nats.Name(name),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) && !consumer.LegacyProbeRefused(err, f.stream) {
				cancel(fmt.Errorf("%w: %w", errRefused, err))
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { cancel(nil) }),
	}, auth...)
	nc, err := nats.Connect(f.url, append(opts, extra...)...)
	if err != nil {
		cancel(nil)
		if errors.Is(err, nats.ErrNoServers) {
			// nats.go drops the dial error of its first round: say why.
			if why := dialError(f.url); why != nil {
				err = fmt.Errorf("%w (%w)", err, why)
			}
		}
		return ctx, nil, nil, fmt.Errorf("connect to NATS at %s (--nats-url): %w", bridge.RedactURLs(f.url), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return ctx, nil, nil, fmt.Errorf("create JetStream handle: %w", err)
	}
	return ctx, nc, js, nil
}

// natsContext is a nats CLI context file (ADR-21): the settings pleg-bridge
// uses of it.
type natsContext struct {
	URL         string `json:"url"`
	Token       string `json:"token"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	InboxPrefix string `json:"inbox_prefix"`
	NSC         string `json:"nsc"`
	JSDomain    string `json:"jetstream_domain"`
	JSAPIPrefix string `json:"jetstream_api_prefix"`
}

// natsConfigDir is where the nats CLI keeps its contexts:
// $XDG_CONFIG_HOME/nats, else ~/.config/nats.
func (f *natsFlags) natsConfigDir() string {
	if d := f.getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "nats")
	}
	if h := f.getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "nats")
	}
	return ""
}

// applyContext fills in, from the named or the selected nats CLI context,
// every setting that neither a flag nor a PLEG_NATS_* variable set. A
// named context that cannot be read is an error naming its file; no
// selected context is not.
func (f *natsFlags) applyContext() error {
	dir := f.natsConfigDir()
	name := f.context
	if name == "" && dir != "" {
		if b, err := os.ReadFile(filepath.Join(dir, "context.txt")); err == nil {
			name = strings.TrimSpace(string(b))
		}
	}
	if name == "" {
		return nil
	}
	if dir == "" || strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("nats context %q (--context): not a context name, or no HOME to find it in", name)
	}
	file := filepath.Join(dir, "context", name+".json")
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("nats context %q (--context): %w", name, err)
	}
	var c natsContext
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("nats context %q: %s: %w", name, file, err)
	}
	if c.NSC != "" || c.JSDomain != "" || c.JSAPIPrefix != "" {
		return fmt.Errorf("nats context %q: %s sets nsc, jetstream_domain or jetstream_api_prefix, which pleg-bridge does not support; give the settings as flags", name, file)
	}
	for _, s := range []struct {
		flag, env string
		dst       *string
		v         string
	}{
		{"nats-url", "PLEG_NATS_URL", &f.url, c.URL},
		{"creds", "PLEG_NATS_CREDS", &f.auth.Creds, c.Creds},
		{"nkey", "PLEG_NATS_NKEY_SEED", &f.auth.NKeySeed, c.NKey},
		{"user", "PLEG_NATS_USER", &f.auth.User, c.User},
		{"password", "PLEG_NATS_PASSWORD", &f.auth.Password, c.Password},
		{"token", "PLEG_NATS_TOKEN", &f.auth.Token, c.Token},
		{"tls-ca", "PLEG_NATS_TLS_CA", &f.auth.TLSCA, c.CA},
		{"tls-cert", "PLEG_NATS_TLS_CERT", &f.auth.TLSCert, c.Cert},
		{"tls-key", "PLEG_NATS_TLS_KEY", &f.auth.TLSKey, c.Key},
		{"inbox-prefix", "", &f.auth.InboxPrefix, c.InboxPrefix},
	} {
		if s.v == "" || f.fs.Changed(s.flag) || s.env != "" && f.getenv(s.env) != "" {
			continue
		}
		*s.dst = expandHome(s.v, f.getenv("HOME"))
	}
	f.contextUsed = name
	return nil
}

// expandHome expands a leading "~/" as the nats CLI does in its contexts'
// file paths.
func expandHome(p, home string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok && home != "" {
		return filepath.Join(home, rest)
	}
	return p
}

// readerScope reads the credentials file, if any: a reader's (pleg-bridge
// creds --reader) is limited to namespaces and to its own inbox, whose
// prefix it sets unless --inbox-prefix does, since without it no reply
// would reach the reader.
func (f *natsFlags) readerScope() error {
	if f.auth.Creds == "" {
		return nil
	}
	b, err := os.ReadFile(f.auth.Creds)
	if err != nil {
		return fmt.Errorf("--creds: %w", err)
	}
	if f.namespaces, err = natsauth.ReaderNamespaces(b); err != nil || len(f.namespaces) == 0 {
		return nil // not a reader's: nats.go says what is wrong with it, if anything
	}
	if f.auth.InboxPrefix == "" {
		f.auth.InboxPrefix, _ = natsauth.ReaderInboxPrefix(b)
	}
	return nil
}

// dialError returns why the first of the comma-separated server URLs
// cannot be reached over TCP (connection refused, a name that does not
// resolve), nil if it can or the URL does not parse.
func dialError(urls string) error {
	first, _, _ := strings.Cut(urls, ",")
	u, err := url.Parse(strings.TrimSpace(first))
	if err != nil || u.Host == "" {
		return nil
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	conn, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		return err
	}
	conn.Close()
	return nil
}

// refusal returns the permission violation that canceled ctx (see
// connect), nil if ctx is live or ended for another reason.
func refusal(ctx context.Context) error {
	if err := context.Cause(ctx); errors.Is(err, errRefused) {
		return err
	}
	return nil
}
