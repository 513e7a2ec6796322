package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pleg-bridge/pleg-bridge/bridge"
	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// envPrefix is the prefix of every configuration variable. The tags carry
// the full names: a bare name (MODE, STREAM, NODE_NAME) would pick up
// unrelated variables of a container's environment.
const envPrefix = "PLEG_"

// lookupFunc reads one environment variable, as os.LookupEnv does: a
// variable set to the empty string is set (PLEG_LISTEN_ADDRESS= turns the
// endpoint off), one that is absent takes its default. Tests pass their own,
// so they never touch the process environment and can run in parallel.
type lookupFunc func(name string) (string, bool)

// logFormat is PLEG_LOG_FORMAT.
type logFormat = cli.LogFormat

// Log formats.
const (
	logAuto = cli.LogAuto
	logText = cli.LogText
	logJSON = cli.LogJSON
)

// Config is the bridge's whole configuration, read once from PLEG_*
// environment variables into typed values. The variable names are contract:
// deployments set them, and the README documents them.
//
// Each field's env tag names its variable and its desc tag describes it for
// --help; the defaults are defaultConfig's, in Go, so that they are typed
// and the stream name and subject prefix come from schemas.
type Config struct {
	NodeName           string        `env:"PLEG_NODE_NAME" desc:"Node name in subjects and events (default: the host name)"`
	CRIEndpoint        string        `env:"PLEG_CRI_ENDPOINT" desc:"CRI socket, unix:///path or a bare path (default: the first of containerd's and CRI-O's sockets that exists)"`
	ContainerdEndpoint string        `env:"PLEG_CONTAINERD_ENDPOINT" desc:"Socket of containerd's own API, whose event service the containerd-events mode follows (default: the CRI socket, where containerd serves both)"`
	CRITimeout         time.Duration `env:"PLEG_CRI_TIMEOUT" desc:"Timeout of each unary CRI call"`
	CRIMaxRecvMsgSize  int           `env:"PLEG_CRI_MAX_RECV_MSG_SIZE" desc:"Largest CRI response accepted, in bytes (gRPC's 4 MiB default breaks at about 4,250 containers)"`

	NATSURL        string        `env:"PLEG_NATS_URL" desc:"NATS server URL(s), comma-separated; unset: run an embedded NATS server with JetStream"`
	NATSCreds      string        `env:"PLEG_NATS_CREDS" desc:"NATS credentials file (JWT and NKey seed)"`
	NATSNKeySeed   string        `env:"PLEG_NATS_NKEY_SEED" desc:"NATS NKey seed file"`
	NATSUser       string        `env:"PLEG_NATS_USER" desc:"NATS user name"`
	NATSPassword   string        `env:"PLEG_NATS_PASSWORD" desc:"NATS password"`
	NATSToken      string        `env:"PLEG_NATS_TOKEN" desc:"NATS authentication token"`
	NATSTokenFile  string        `env:"PLEG_NATS_TOKEN_FILE" desc:"File holding the NATS authentication token, read again at every reconnect so that a rotated Secret takes effect"`
	NATSTLSCA      string        `env:"PLEG_NATS_TLS_CA" desc:"CA certificate file to verify the NATS server"`
	NATSTLSCert    string        `env:"PLEG_NATS_TLS_CERT" desc:"Client certificate file for NATS mutual TLS"`
	NATSTLSKey     string        `env:"PLEG_NATS_TLS_KEY" desc:"Client key file for NATS mutual TLS"`
	DataDir        string        `env:"PLEG_DATA_DIR" desc:"Data directory: the checkpoint and the spool, and the embedded NATS server's store; empty: memory only (needs PLEG_NATS_URL)"`
	SpoolMaxBytes  int64         `env:"PLEG_SPOOL_MAX_BYTES" desc:"Bound of the disk spool under PLEG_DATA_DIR that takes the events the outbox has no room for, in bytes (0: no spool)"`
	RepairWindow   time.Duration `env:"PLEG_REPAIR_WINDOW" desc:"How long acknowledged events are kept under PLEG_DATA_DIR to check, after a reconnect or a stream leader election, that the NATS servers still hold them, and publish again what they lost (a power loss or OS crash loses writes nats-server had not flushed, up to its 2-minute sync_interval); at least 2m (0: no repair)"`
	RepairMaxBytes int64         `env:"PLEG_REPAIR_MAX_BYTES" desc:"Bound of the acknowledged events kept for the repair, in bytes; past it the oldest go first"`
	EmbeddedNATS   string        `env:"PLEG_EMBEDDED_NATS_LISTEN" desc:"Listen address of the embedded NATS server"`
	SubjectPrefix  string        `env:"PLEG_SUBJECT_PREFIX" desc:"First subject token(s): <prefix>.<node>.<namespace>.<podUID>.<eventType>"`

	NATSInboxPrefix string `env:"PLEG_NATS_INBOX_PREFIX" desc:"Prefix of the subjects NATS replies come back on; {node} stands for the node's subject token. Per-node credentials (pleg-bridge creds) need _INBOX_{node}; unset: _INBOX"`

	Stream                string        `env:"PLEG_STREAM" desc:"JetStream stream name"`
	StreamReplicas        int           `env:"PLEG_STREAM_REPLICAS" desc:"Stream replicas (1 on a single server, 3 in a cluster)"`
	StreamMaxAge          time.Duration `env:"PLEG_STREAM_MAX_AGE" desc:"How long the stream keeps events (0: forever)"`
	StreamDuplicateWindow time.Duration `env:"PLEG_STREAM_DUPLICATE_WINDOW" desc:"Window in which JetStream drops a repeated event ID"`
	StreamManage          bool          `env:"PLEG_STREAM_MANAGE" desc:"Create the stream if it is missing (false: leave it to the operator)"`
	ArchiveMaxAge         time.Duration `env:"PLEG_ARCHIVE_MAX_AGE" desc:"Keep an archive stream of every event this long, on subjects without the pod UID (far less server memory; docs/capacity.md), sourced from the stream; at least PLEG_STREAM_MAX_AGE, which it lets you shorten (e.g. 24h with 168h here); needs PLEG_STREAM_MANAGE=true (0: no archive)"`
	ArchiveStream         string        `env:"PLEG_ARCHIVE_STREAM" desc:"Archive stream name, with PLEG_ARCHIVE_MAX_AGE (empty: <PLEG_STREAM>_ARCHIVE)"`
	StateBucket           string        `env:"PLEG_STATE_BUCKET" desc:"JetStream KV bucket of every container's latest event, for pleg-bridge ps and watchers (empty: off); created with the stream's replicas when PLEG_STREAM_MANAGE is true"`

	CEMode      publish.Mode `env:"PLEG_CE_MODE" desc:"CloudEvents content mode: structured or binary"`
	ClusterName string       `env:"PLEG_CLUSTER_NAME" desc:"Cluster name; sets the CloudEvent source to /clusters/<cluster>/nodes/<node>"`
	// PodAnnotations is a list: PLEG_POD_ANNOTATIONS=key1,key2.
	PodAnnotations []string `env:"PLEG_POD_ANNOTATIONS" desc:"Comma-separated keys of the pod annotations events carry in pod.annotations (empty: none; pod labels are always carried)"`

	Mode                generator.Mode `env:"PLEG_MODE" desc:"auto, evented, containerd-events or generic"`
	RelistPeriod        time.Duration  `env:"PLEG_RELIST_PERIOD" desc:"Relist period in generic mode"`
	RelistThreshold     time.Duration  `env:"PLEG_RELIST_THRESHOLD" desc:"/healthz fails when the last relist is older than this"`
	EventedRelistPeriod time.Duration  `env:"PLEG_EVENTED_RELIST_PERIOD" desc:"Safety-net relist period while the event stream is healthy"`
	ExitsFromCRI        bool           `env:"PLEG_EXITS_FROM_CRI" desc:"Report exits only once CRI shows them (true), rather than from containerd's task exit, checked against CRI after (false)"`

	PublishMaxInFlight int           `env:"PLEG_PUBLISH_MAX_IN_FLIGHT" desc:"Published events awaiting a JetStream ack, at most"`
	OutboxSize         int           `env:"PLEG_OUTBOX_SIZE" desc:"Events waiting for delivery in memory, at most; more spill to the spool (the generator never waits)"`
	ShutdownTimeout    time.Duration `env:"PLEG_SHUTDOWN_TIMEOUT" desc:"How long pending publishes may take to be acked at shutdown"`

	ListenAddress string     `env:"PLEG_LISTEN_ADDRESS" desc:"Address of /metrics, /healthz and /readyz (empty: off)"`
	LogLevel      slog.Level `env:"PLEG_LOG_LEVEL" desc:"debug, info, warn or error"`
	LogFormat     logFormat  `env:"PLEG_LOG_FORMAT" desc:"auto (colour on a terminal, JSON otherwise), text or json"`
}

// defaultConfig is the configuration of an empty environment, but for the
// node name, which loadConfig takes from the host.
func defaultConfig() Config {
	return Config{
		CRITimeout:            cri.DefaultTimeout,
		CRIMaxRecvMsgSize:     cri.DefaultMaxRecvMsgSize,
		DataDir:               "/var/lib/pleg-bridge",
		SpoolMaxBytes:         bridge.DefaultSpoolMaxBytes,
		RepairWindow:          bridge.DefaultRepairWindow,
		RepairMaxBytes:        bridge.DefaultRepairMaxBytes,
		EmbeddedNATS:          bridge.DefaultEmbeddedListen,
		SubjectPrefix:         schemas.DefaultSubjectPrefix,
		Stream:                schemas.DefaultStream,
		StreamReplicas:        1,
		StreamMaxAge:          7 * 24 * time.Hour,
		StreamDuplicateWindow: publish.DefaultDuplicateWindow,
		StreamManage:          true,
		StateBucket:           schemas.DefaultStateBucket,
		CEMode:                publish.ModeStructured,
		Mode:                  generator.DefaultMode,
		RelistPeriod:          generator.DefaultRelistPeriod,
		RelistThreshold:       generator.DefaultRelistThreshold,
		EventedRelistPeriod:   generator.DefaultEventedRelistPeriod,
		PublishMaxInFlight:    publish.DefaultMaxInFlight,
		OutboxSize:            publish.DefaultOutboxSize,
		ShutdownTimeout:       publish.DefaultDrainTimeout,
		ListenAddress:         ":9470",
		LogLevel:              slog.LevelInfo,
		LogFormat:             logAuto,
	}
}

// loadConfig reads the configuration through lookup and validates it. Every
// error names the variable at fault and the value it got, and all of them
// are reported together; a variable that does not parse keeps its default,
// so that it is reported once.
func loadConfig(lookup lookupFunc) (Config, error) {
	c := defaultConfig()
	var errs []error
	v := reflect.ValueOf(&c).Elem()
	for _, f := range reflect.VisibleFields(v.Type()) {
		name := f.Tag.Get("env")
		value, ok := lookup(name)
		if !ok {
			continue
		}
		if err := setField(v.FieldByIndex(f.Index).Addr().Interface(), value); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, value, err))
		}
	}
	if err := c.validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("PLEG_NODE_NAME is unset and the host name is unknown: %w", err)
		}
		c.NodeName = h
	}
	return c, nil
}

// setField parses s into the field p points to, by the field's type.
func setField(p any, s string) error {
	switch p := p.(type) {
	case *string:
		*p = s
	case *[]string:
		*p = nil
		for k := range strings.SplitSeq(s, ",") {
			if k = strings.TrimSpace(k); k != "" {
				*p = append(*p, k)
			}
		}
	case *bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return errors.New("want true or false")
		}
		*p = b
	case *int:
		// Base 0, as envconfig read them: 0x, 0o and 0b prefixes and
		// underscores (268_435_456) are accepted.
		n, err := strconv.ParseInt(s, 0, strconv.IntSize)
		if err != nil {
			return errors.New("not an integer")
		}
		*p = int(n)
	case *int64:
		n, err := strconv.ParseInt(s, 0, 64)
		if err != nil {
			return errors.New("not an integer")
		}
		*p = n
	case *time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return errors.New("not a duration (like 500ms, 30s or 3m)")
		}
		*p = d
	case *generator.Mode:
		// The parser's error names every mode it accepts; a list written
		// here would fall behind the parser (it once left out
		// containerd-events).
		m, err := generator.ParseMode(s)
		if err != nil {
			return err
		}
		*p = m
	case *publish.Mode:
		switch m := publish.Mode(s); m {
		case publish.ModeStructured, publish.ModeBinary:
			*p = m
		default:
			return errors.New("want structured or binary")
		}
	case *slog.Level:
		if err := p.UnmarshalText([]byte(s)); err != nil {
			return errors.New("want debug, info, warn or error")
		}
	case *logFormat:
		switch f := logFormat(s); f {
		case logAuto, logText, logJSON:
			*p = f
		default:
			return errors.New("want auto, text or json")
		}
	default:
		// A field of a type added without a case here; the tests set every
		// variable, so this does not reach a user.
		return fmt.Errorf("cannot be read into a %T", p)
	}
	return nil
}

// validate checks the values against each other and against what the
// components accept. The parsed types (modes, level, format) are valid by
// construction.
func (c Config) validate() error {
	var errs []error
	bad := func(name string, value any, why string) {
		errs = append(errs, fmt.Errorf("PLEG_%s=%q: %s", name, fmt.Sprint(value), why))
	}
	if err := schemas.ValidatePrefix(c.SubjectPrefix); err != nil {
		bad("SUBJECT_PREFIX", c.SubjectPrefix, "not a valid subject prefix: "+err.Error())
	}
	if c.CRIEndpoint != "" {
		if _, err := cri.ParseEndpoint(c.CRIEndpoint); err != nil {
			bad("CRI_ENDPOINT", c.CRIEndpoint, err.Error())
		}
	}
	if c.ContainerdEndpoint != "" {
		if _, err := cri.ParseEndpoint(c.ContainerdEndpoint); err != nil {
			bad("CONTAINERD_ENDPOINT", c.ContainerdEndpoint, err.Error())
		}
	}
	if c.Stream == "" || strings.ContainsAny(c.Stream, ".*> \t\r\n/\\") {
		bad("STREAM", c.Stream, "a stream name must be non-empty without . * > / \\ or whitespace")
	}
	if !validBucket(c.StateBucket) {
		bad("STATE_BUCKET", c.StateBucket, "a bucket name holds only letters, digits, - and _ (empty: no state bucket)")
	}
	positive := map[string]time.Duration{
		"RELIST_PERIOD": c.RelistPeriod, "RELIST_THRESHOLD": c.RelistThreshold,
		"EVENTED_RELIST_PERIOD": c.EventedRelistPeriod, "CRI_TIMEOUT": c.CRITimeout,
		"STREAM_DUPLICATE_WINDOW": c.StreamDuplicateWindow, "SHUTDOWN_TIMEOUT": c.ShutdownTimeout,
	}
	for _, name := range slices.Sorted(maps.Keys(positive)) {
		if positive[name] <= 0 {
			bad(name, positive[name], "must be positive")
		}
	}
	if c.StreamDuplicateWindow > 0 && c.StreamDuplicateWindow < 100*time.Millisecond {
		bad("STREAM_DUPLICATE_WINDOW", c.StreamDuplicateWindow, "JetStream needs at least 100ms")
	}
	if c.StreamMaxAge < 0 {
		bad("STREAM_MAX_AGE", c.StreamMaxAge, "must not be negative")
	}
	switch {
	case c.ArchiveMaxAge < 0:
		bad("ARCHIVE_MAX_AGE", c.ArchiveMaxAge, "must not be negative (0: no archive)")
	case c.ArchiveMaxAge == 0:
	case c.StreamMaxAge == 0:
		bad("ARCHIVE_MAX_AGE", c.ArchiveMaxAge, "PLEG_STREAM_MAX_AGE=0 keeps events forever: an archive would keep them for less; set PLEG_STREAM_MAX_AGE shorter, or no archive")
	case c.ArchiveMaxAge < c.StreamMaxAge:
		bad("ARCHIVE_MAX_AGE", c.ArchiveMaxAge, fmt.Sprintf("must be at least PLEG_STREAM_MAX_AGE (%s): the archive keeps the stream's events longer", c.StreamMaxAge))
	case !c.StreamManage:
		bad("ARCHIVE_MAX_AGE", c.ArchiveMaxAge, "needs PLEG_STREAM_MANAGE=true: the bridge creates and keeps the archive")
	}
	if c.ArchiveStream != "" && (strings.ContainsAny(c.ArchiveStream, ".*> \t\r\n/\\") || c.ArchiveStream == c.Stream) {
		bad("ARCHIVE_STREAM", c.ArchiveStream, "an archive stream name must be without . * > / \\ or whitespace, and not PLEG_STREAM's")
	}
	if c.RelistThreshold > 0 && c.RelistThreshold <= c.RelistPeriod {
		bad("RELIST_THRESHOLD", c.RelistThreshold, "must be longer than PLEG_RELIST_PERIOD")
	}
	if c.StreamReplicas < 1 || c.StreamReplicas > 5 {
		bad("STREAM_REPLICAS", c.StreamReplicas, "want 1 to 5")
	}
	if c.CRIMaxRecvMsgSize < 4<<20 {
		bad("CRI_MAX_RECV_MSG_SIZE", c.CRIMaxRecvMsgSize, "want at least 4194304")
	}
	if c.PublishMaxInFlight < 1 {
		bad("PUBLISH_MAX_IN_FLIGHT", c.PublishMaxInFlight, "must be positive")
	}
	if c.OutboxSize < c.PublishMaxInFlight {
		bad("OUTBOX_SIZE", c.OutboxSize, "must be at least PLEG_PUBLISH_MAX_IN_FLIGHT")
	}
	if c.SpoolMaxBytes < 0 {
		bad("SPOOL_MAX_BYTES", c.SpoolMaxBytes, "must not be negative (0: no spool)")
	}
	if c.RepairWindow < 0 || (c.RepairWindow > 0 && c.RepairWindow < bridge.MinRepairWindow) {
		bad("REPAIR_WINDOW", c.RepairWindow, "must be at least 2m, nats-server's default sync_interval, which a power loss can lose (0: no repair)")
	}
	if c.RepairWindow > 0 && c.RepairMaxBytes < 1<<20 {
		bad("REPAIR_MAX_BYTES", c.RepairMaxBytes, "must be at least 1048576 to hold PLEG_REPAIR_WINDOW of acknowledged events")
	}
	if c.DataDir == "" && c.NATSURL == "" {
		bad("DATA_DIR", c.DataDir, "the embedded NATS server (PLEG_NATS_URL unset) keeps its store there; set both or PLEG_NATS_URL")
	}
	if c.NATSToken != "" && c.NATSTokenFile != "" {
		bad("NATS_TOKEN_FILE", c.NATSTokenFile, "set PLEG_NATS_TOKEN or PLEG_NATS_TOKEN_FILE, not both")
	} else if c.NATSTokenFile != "" {
		if _, err := bridge.ReadToken(c.NATSTokenFile); err != nil {
			bad("NATS_TOKEN_FILE", c.NATSTokenFile, err.Error())
		}
	}
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		bad("NATS_TLS_CERT", c.NATSTLSCert, "PLEG_NATS_TLS_CERT and PLEG_NATS_TLS_KEY go together")
	}
	if c.NATSCreds != "" && c.NATSNKeySeed != "" {
		bad("NATS_NKEY_SEED", c.NATSNKeySeed, "set PLEG_NATS_CREDS or PLEG_NATS_NKEY_SEED, not both: a credentials file holds its own NKey seed")
	}
	if _, err := bridge.ExpandInboxPrefix(c.NATSInboxPrefix, c.NodeName); err != nil {
		bad("NATS_INBOX_PREFIX", c.NATSInboxPrefix, err.Error())
	}
	for i, k := range c.PodAnnotations {
		if !isAnnotationKey(k) {
			bad("POD_ANNOTATIONS", strings.Join(c.PodAnnotations, ","), fmt.Sprintf("%q is not an annotation key ([<DNS subdomain>/]<name>, the name at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)", k))
		} else if slices.Contains(c.PodAnnotations[:i], k) {
			bad("POD_ANNOTATIONS", strings.Join(c.PodAnnotations, ","), fmt.Sprintf("%q is named twice", k))
		}
	}
	return errors.Join(errs...)
}

// Kubernetes annotation keys: a name, optionally after a DNS subdomain
// prefix and a slash.
var (
	annotationName   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	annotationPrefix = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// isAnnotationKey reports whether k is a valid Kubernetes annotation key,
// so that a typo in PLEG_POD_ANNOTATIONS is reported at start rather than
// silently matching nothing.
func isAnnotationKey(k string) bool {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		return annotationName.MatchString(k)
	}
	return len(prefix) <= 253 && annotationPrefix.MatchString(prefix) && annotationName.MatchString(name)
}

// bridgeOptions are the bridge's options of c, with logger and the metrics
// registry main made.
func (c Config) bridgeOptions(logger *slog.Logger, reg *prometheus.Registry) bridge.Options {
	return bridge.Options{
		Node:                c.NodeName,
		ClusterName:         c.ClusterName,
		Version:             versionString(),
		PodAnnotations:      c.PodAnnotations,
		SubjectPrefix:       c.SubjectPrefix,
		CEMode:              c.CEMode,
		CRIEndpoint:         c.CRIEndpoint,
		ContainerdEndpoint:  c.ContainerdEndpoint,
		CRI:                 cri.Options{Timeout: c.CRITimeout, MaxRecvMsgSize: c.CRIMaxRecvMsgSize},
		Mode:                c.Mode,
		RelistPeriod:        c.RelistPeriod,
		RelistThreshold:     c.RelistThreshold,
		EventedRelistPeriod: c.EventedRelistPeriod,
		ExitsFromCRI:        c.ExitsFromCRI,
		NATS: bridge.NATSOptions{
			URL: c.NATSURL, EmbeddedListen: c.EmbeddedNATS,
			Creds: c.NATSCreds, NKeySeed: c.NATSNKeySeed, User: c.NATSUser, Password: c.NATSPassword,
			Token: c.NATSToken, TokenFile: c.NATSTokenFile, TLSCA: c.NATSTLSCA, TLSCert: c.NATSTLSCert, TLSKey: c.NATSTLSKey,
			InboxPrefix: c.NATSInboxPrefix,
		},
		Stream: bridge.StreamOptions{
			Name: c.Stream, Replicas: c.StreamReplicas, MaxAge: c.StreamMaxAge,
			DuplicateWindow: c.StreamDuplicateWindow, Manage: c.StreamManage,
			ArchiveMaxAge: c.ArchiveMaxAge, ArchiveName: c.ArchiveStream,
		},
		StateBucket:        c.StateBucket,
		PublishMaxInFlight: c.PublishMaxInFlight,
		OutboxSize:         c.OutboxSize,
		ShutdownTimeout:    c.ShutdownTimeout,
		DataDir:            c.DataDir,
		SpoolMaxBytes:      c.SpoolMaxBytes,
		RepairWindow:       repairWindow(c.RepairWindow),
		RepairMaxBytes:     c.RepairMaxBytes,
		ListenAddress:      c.ListenAddress,
		Registry:           reg,
		Logger:             logger,
	}
}

// repairWindow maps PLEG_REPAIR_WINDOW to bridge.Options.RepairWindow:
// the variable's 0 turns the repair off, which the option says with a
// negative value (its 0 takes the default).
func repairWindow(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// printConfigHelp prints every variable with its default and description.
func printConfigHelp(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tDESCRIPTION")
	defaults := reflect.ValueOf(defaultConfig())
	for _, f := range reflect.VisibleFields(defaults.Type()) {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Tag.Get("env"), formatDefault(defaults.FieldByIndex(f.Index).Interface()), f.Tag.Get("desc"))
	}
	return tw.Flush()
}

// formatDefault writes a default as a user would set it: 168h rather than
// 168h0m0s, info rather than INFO.
func formatDefault(v any) string {
	switch v := v.(type) {
	case time.Duration:
		s := v.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	case slog.Level:
		return strings.ToLower(v.String())
	case []string:
		return strings.Join(v, ",")
	}
	return fmt.Sprint(v)
}

// validBucket reports whether name is empty or a JetStream KV bucket name.
func validBucket(name string) bool {
	for _, r := range name {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// devVariablePrefixes are PLEG_ variables that are not the bridge's
// configuration but the test harness's (the containerd end-to-end tests,
// the benchmarks): a developer's shell may hold them, and they are not
// typos.
var devVariablePrefixes = []string{"PLEG_E2E_", "PLEG_BENCH_"}

// unknownVariable is a PLEG_ variable of the environment that is not a
// configuration variable, with the known variable closest to it.
type unknownVariable struct{ name, closest string }

// unknownVariables returns the variables of environ (as os.Environ gives
// it, NAME=value) that have the PLEG_ prefix but are not configuration
// variables, sorted by name: a typo such as PLEG_MOD=generic would
// otherwise be ignored in silence. The command warns of them rather than
// failing: a newer manifest may set a variable this version does not know.
func unknownVariables(environ []string) []unknownVariable {
	known := configNames()
	var unknown []unknownVariable
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || slices.Contains(known, name) ||
			slices.ContainsFunc(devVariablePrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		closest := slices.MinFunc(known, func(a, b string) int {
			return editDistance(name, a) - editDistance(name, b)
		})
		unknown = append(unknown, unknownVariable{name: name, closest: closest})
	}
	slices.SortFunc(unknown, func(a, b unknownVariable) int { return strings.Compare(a.name, b.name) })
	return unknown
}

// warnUnknownVariables logs a warning for each of unknownVariables(environ).
func warnUnknownVariables(logger *slog.Logger, environ []string) {
	for _, u := range unknownVariables(environ) {
		logger.Warn("unknown configuration variable is ignored; pleg-bridge run --help lists them",
			"variable", u.name, "did_you_mean", u.closest)
	}
}

// configNames lists the variable of every Config field, in field order.
func configNames() []string {
	var names []string
	for _, f := range reflect.VisibleFields(reflect.TypeFor[Config]()) {
		names = append(names, f.Tag.Get("env"))
	}
	return names
}

// editDistance is the Levenshtein distance between a and b, in bytes: the
// fewest insertions, deletions and substitutions that turn one into the
// other.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
