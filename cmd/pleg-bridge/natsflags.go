package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/pleg-bridge/pleg-bridge/bridge"
)

// natsFlags are the flags of the commands that read from NATS (tail,
// replay, ps, and the completion of their names): where the server is and
// how to authenticate, with defaults from the PLEG_NATS_* environment the
// agent itself reads, so that a shell in the bridge's pod, or one with the
// same variables, connects as the bridge does.
type natsFlags struct {
	url  string
	auth bridge.NATSOptions
}

// addNATSFlags defines the NATS flags on fs.
func addNATSFlags(fs *pflag.FlagSet, getenv func(string) string) *natsFlags {
	f := &natsFlags{}
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
	if err := f.check(); err != nil {
		return ctx, nil, nil, err
	}
	auth, err := f.auth.ClientOptions(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return ctx, nil, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	opts := append([]nats.Option{
		nats.Name(name),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) && !legacyProbe(err) {
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
		return ctx, nil, nil, fmt.Errorf("connect to NATS at %s (--nats-url): %w", redactURLs(f.url), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return ctx, nil, nil, fmt.Errorf("create JetStream handle: %w", err)
	}
	return ctx, nc, js, nil
}

// legacyProbe reports whether err refuses the consumer package's look for
// events of the legacy subject layout (consumer.LegacyAuto), a message get,
// which a reader limited to namespaces may not make: it then reads the
// current layout only, and goes on.
func legacyProbe(err error) bool {
	s := err.Error()
	return strings.Contains(s, `"$JS.API.STREAM.MSG.GET.`) || strings.Contains(s, `"$JS.API.DIRECT.GET.`)
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
