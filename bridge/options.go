package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// Defaults of the command's configuration that the bridge's other users
// (the benchmark) take too.
const (
	// DefaultEmbeddedListen is where the embedded NATS server listens when
	// NATSOptions.EmbeddedListen is empty: loopback only, the NATS port.
	DefaultEmbeddedListen = "127.0.0.1:4222"
	// DefaultSpoolMaxBytes bounds the spool of a deployment that does not
	// choose: at about 600 bytes an event as the spool encodes it (a Died
	// event with image digest and reason, measured; pod labels add more),
	// 256 MiB holds some 400,000 events, twenty times the memory outbox and
	// hours of a busy node's churn while NATS is away, and is little on a
	// node's disk. Options.SpoolMaxBytes has no default: zero means no
	// spool.
	DefaultSpoolMaxBytes = 256 << 20
	// DefaultRepairWindow is how long acknowledged events are kept to
	// check that the stream still holds them: longer than nats-server's
	// default sync_interval (2 minutes), within which a power loss or an
	// OS crash can lose writes the servers acknowledged, with room for
	// the servers' restart.
	DefaultRepairWindow = 5 * time.Minute
	// DefaultRepairMaxBytes bounds the acknowledged events kept for the
	// repair: at about 600 bytes an event, some 28,000 events, five
	// minutes of a node making 90 transitions a second (a busy node makes
	// 6, a drained one 6 for 30 s). They are held in memory too, at about
	// twice that, so the bound is also the repair's memory.
	DefaultRepairMaxBytes = 16 << 20
	// MinRepairWindow is the shortest repair window accepted: nats-server's
	// default sync_interval. A shorter one cannot cover what its lazy
	// flush can lose.
	MinRepairWindow = 2 * time.Minute
)

// Options configure a Bridge. Zero values take the components' defaults;
// Node and CRIEndpoint are required, and so is DataDir without NATS.URL.
type Options struct {
	// Node is the node name in subjects and events. Required.
	Node string
	// ClusterName, when set, puts the node under /clusters/<cluster> in the
	// CloudEvent source.
	ClusterName string
	// Version is the pleg-bridge version the bridge records in the
	// metadata of the stream, the archive and the state bucket it creates
	// or updates, beside the contract version; empty means publish's
	// default (the build info's main module version, or "dev").
	Version string
	// SubjectPrefix is the first subject token(s); empty means
	// schemas.DefaultSubjectPrefix.
	SubjectPrefix string
	// CEMode is the CloudEvents content mode; empty means structured.
	CEMode publish.Mode
	// PodAnnotations are the keys of the pod annotations events carry
	// (generator.Options.PodAnnotations); empty means none.
	PodAnnotations []string

	// CRIEndpoint is the runtime's socket, unix:///path or a bare path.
	// Required: finding a default (cri.DiscoverEndpoint) is the
	// configuration's job, which can name the setting to change.
	CRIEndpoint string
	// CRI configures the CRI client (call timeout, largest response).
	CRI cri.Options
	// ContainerdEndpoint is the socket of containerd's own API, whose event
	// service the containerd-events mode (and auto mode on containerd 1.x)
	// follows; empty means CRIEndpoint, where containerd serves both.
	ContainerdEndpoint string
	// Mode selects the generator's sources; empty means generator.DefaultMode,
	// which the generator applies.
	Mode generator.Mode
	// RelistPeriod, RelistThreshold and EventedRelistPeriod are the
	// generator's; zero takes its defaults.
	RelistPeriod, RelistThreshold, EventedRelistPeriod time.Duration
	// ExitsFromCRI is generator.Options.ExitsFromCRI: exits wait for CRI
	// rather than being reported from containerd's task exits.
	ExitsFromCRI bool

	NATS   NATSOptions
	Stream StreamOptions
	// StateBucket is the key-value bucket where the bridge keeps its
	// node's current containers, one key per container (statebucket.Writer);
	// empty means none. With Stream.Manage the bucket is created if
	// missing, with Stream.Replicas replicas.
	StateBucket string

	// PublishMaxInFlight and OutboxSize bound the publisher's messages
	// awaiting an ack and its memory outbox; zero takes its defaults.
	PublishMaxInFlight, OutboxSize int
	// ShutdownTimeout bounds the delivery of what is pending once Run's ctx
	// is done; zero means publish.DefaultDrainTimeout.
	ShutdownTimeout time.Duration
	// StartupOver, if set, is called once, from the bridge's own
	// goroutine, when the start-up, its memory peak, is over: the first
	// relist merged and its events acked, or 30 s after that merge if
	// they cannot be. The process that runs the bridge moves the garbage
	// collector's target off its start-up value there (internal/gctune);
	// the bridge changes no process-wide state itself.
	StartupOver func()

	// DataDir holds the durable state (the checkpoint and the spool, one
	// bbolt file) and the embedded NATS server's store; empty means memory
	// only: a restart publishes the node's containers as new, and events
	// the outbox has no room for wait in the generator's state.
	DataDir string
	// SpoolMaxBytes bounds the disk spool under DataDir; 0 means no spool.
	SpoolMaxBytes int64
	// RepairWindow is how long the events JetStream acknowledged are kept
	// under DataDir, so that the bridge can check, after a reconnect, a
	// stream leader election or a sequence going backwards, that the
	// stream still holds them, and publish again what the servers lost
	// (a power loss or an OS crash loses what nats-server had not yet
	// flushed). 0 means DefaultRepairWindow; a negative value turns the
	// repair off. Needs DataDir.
	RepairWindow time.Duration
	// RepairMaxBytes bounds the events kept for the repair; 0 means
	// DefaultRepairMaxBytes. When it is reached the oldest go first, and
	// the window is shorter than RepairWindow (logged).
	RepairMaxBytes int64

	// ListenAddress is where /metrics, /healthz and /readyz are served;
	// empty means nowhere. Run binds it before it starts anything else.
	ListenAddress string
	// Registry receives every component's metrics and is what /metrics
	// serves; nil means a new one. A registry serves one Run: the
	// components register their metrics on it.
	Registry *prometheus.Registry
	// Logger receives every component's logs; nil discards them.
	Logger *slog.Logger

	Hooks Hooks
}

// NATSOptions say which NATS the bridge publishes to and how it
// authenticates.
type NATSOptions struct {
	// URL is the server URL, or several comma-separated; empty means an
	// embedded server with JetStream, its store under Options.DataDir.
	URL string
	// EmbeddedListen is the embedded server's listen address (host:port,
	// port -1 for a random one); empty means DefaultEmbeddedListen.
	EmbeddedListen string
	// Creds is a credentials file (JWT and NKey seed); NKeySeed an NKey
	// seed file.
	Creds, NKeySeed string
	// User and Password authenticate by name.
	User, Password string
	// Token is an authentication token; TokenFile a file holding one, read
	// again at every reconnect so that a rotated Secret takes effect. Not
	// both.
	Token, TokenFile string
	// TLSCA verifies the server; TLSCert and TLSKey (together) are the
	// client's certificate for mutual TLS.
	TLSCA, TLSCert, TLSKey string
	// InboxPrefix is the start of the subjects the bridge receives replies
	// on (JetStream acks, API answers, its consumers' messages); "{node}"
	// in it stands for the node's subject token (ExpandInboxPrefix). Empty
	// means nats.go's _INBOX. Per-node credentials (natsauth) allow only
	// _INBOX_{node}.
	InboxPrefix string
}

// StreamOptions describe the JetStream stream the events go to.
type StreamOptions struct {
	// Name is the stream name; empty means schemas.DefaultStream.
	Name string
	// Replicas is the number of replicas of a stream the bridge creates; 0
	// means 1.
	Replicas int
	// MaxAge is how long the stream keeps events; 0 means forever.
	MaxAge time.Duration
	// DuplicateWindow is the stream's duplicate window; 0 means
	// publish.DefaultDuplicateWindow.
	DuplicateWindow time.Duration
	// Manage makes Run create the stream if it is missing and set its max
	// age and duplicate window; false leaves the stream to the operator.
	Manage bool
	// ArchiveMaxAge, with Manage, makes Run keep an archive stream too
	// (publish.EnsureArchive): a copy of the stream, sourced through
	// subject transforms that drop the pod UID token, kept this long
	// (typically longer than MaxAge, which is then short). 0 means no
	// archive.
	ArchiveMaxAge time.Duration
	// ArchiveName is the archive stream's name; empty means
	// schemas.ArchiveName(Name).
	ArchiveName string
}

// Hooks let a caller observe the production pipeline without copying it
// (the latency benchmark). Each is optional.
type Hooks struct {
	// WrapRuntime wraps the runtime the generator reads: the CRI client,
	// already instrumented with the CRI metrics.
	WrapRuntime func(generator.Runtime) generator.Runtime
	// WrapSink wraps the publisher as the generator's sink.
	WrapSink func(generator.Sink) generator.Sink
	// OnAck is called with each event JetStream acknowledged, after the
	// checkpoint recorded it, from the publisher's goroutine: it must not
	// block for long, delivery waits for it.
	OnAck func(generator.Event)
}

// repairWindow returns the window of the repair, 0 when it is off.
func (o Options) repairWindow() time.Duration {
	switch {
	case o.RepairWindow < 0:
		return 0
	case o.RepairWindow == 0:
		return DefaultRepairWindow
	}
	return o.RepairWindow
}

// check returns the errors of the options no default can fix, each naming
// its option.
func (o Options) check() error {
	var errs []error
	if o.Node == "" {
		errs = append(errs, errors.New("node name is empty"))
	}
	if o.CRIEndpoint == "" {
		errs = append(errs, errors.New("CRI endpoint is empty"))
	}
	if o.NATS.URL == "" && o.DataDir == "" {
		errs = append(errs, errors.New("no NATS URL and no data directory for an embedded server's store"))
	}
	if o.SpoolMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("spool max bytes %d is negative", o.SpoolMaxBytes))
	}
	if w := o.repairWindow(); w > 0 && w < MinRepairWindow {
		errs = append(errs, fmt.Errorf("repair window %s is shorter than %s, nats-server's default sync_interval, which a power loss can lose", w, MinRepairWindow))
	}
	if o.RepairMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("repair max bytes %d is negative", o.RepairMaxBytes))
	}
	if o.NATS.Token != "" && o.NATS.TokenFile != "" {
		errs = append(errs, errors.New("NATS token and token file are both set"))
	}
	if (o.NATS.TLSCert == "") != (o.NATS.TLSKey == "") {
		errs = append(errs, errors.New("NATS TLS certificate and key go together"))
	}
	if _, err := ExpandInboxPrefix(o.NATS.InboxPrefix, o.Node); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("configure bridge: %w", err)
	}
	return nil
}

// withDefaults returns o with the defaults applied.
func (o Options) withDefaults() Options {
	if o.SubjectPrefix == "" {
		o.SubjectPrefix = schemas.DefaultSubjectPrefix
	}
	if o.NATS.EmbeddedListen == "" {
		o.NATS.EmbeddedListen = DefaultEmbeddedListen
	}
	// check refused a pattern that does not expand.
	o.NATS.InboxPrefix, _ = ExpandInboxPrefix(o.NATS.InboxPrefix, o.Node)
	if o.Stream.Name == "" {
		o.Stream.Name = schemas.DefaultStream
	}
	if o.Stream.Replicas == 0 {
		o.Stream.Replicas = 1
	}
	if o.Stream.DuplicateWindow == 0 {
		o.Stream.DuplicateWindow = publish.DefaultDuplicateWindow
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = publish.DefaultDrainTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}
