package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// envPrefix is the prefix of every configuration variable. The tags carry
// the full names and Process runs without a prefix: with a prefix, envconfig
// falls back to the bare tag name (MODE, STREAM, NODE_NAME), which would
// pick up unrelated variables of a container's environment.
const envPrefix = "PLEG_"

// Config is the bridge's whole configuration, read once from PLEG_*
// environment variables. The names are contract (DESIGN.md §8).
type Config struct {
	NodeName          string        `envconfig:"PLEG_NODE_NAME" desc:"Node name in subjects and events (default: the host name)"`
	CRIEndpoint       string        `envconfig:"PLEG_CRI_ENDPOINT" desc:"CRI socket, unix:///path or a bare path (default: the first of containerd's and CRI-O's sockets that exists)"`
	CRITimeout        time.Duration `envconfig:"PLEG_CRI_TIMEOUT" default:"30s" desc:"Timeout of each unary CRI call"`
	CRIMaxRecvMsgSize int           `envconfig:"PLEG_CRI_MAX_RECV_MSG_SIZE" default:"67108864" desc:"Largest CRI response accepted, in bytes (gRPC's 4 MiB default breaks at about 4,250 containers)"`

	NATSURL       string `envconfig:"PLEG_NATS_URL" desc:"NATS server URL(s), comma-separated; unset: run an embedded NATS server with JetStream"`
	NATSCreds     string `envconfig:"PLEG_NATS_CREDS" desc:"NATS credentials file (JWT and NKey seed)"`
	NATSNKeySeed  string `envconfig:"PLEG_NATS_NKEY_SEED" desc:"NATS NKey seed file"`
	NATSUser      string `envconfig:"PLEG_NATS_USER" desc:"NATS user name"`
	NATSPassword  string `envconfig:"PLEG_NATS_PASSWORD" desc:"NATS password"`
	NATSToken     string `envconfig:"PLEG_NATS_TOKEN" desc:"NATS authentication token"`
	NATSTokenFile string `envconfig:"PLEG_NATS_TOKEN_FILE" desc:"File holding the NATS authentication token, read again at every reconnect so that a rotated Secret takes effect"`
	NATSTLSCA     string `envconfig:"PLEG_NATS_TLS_CA" desc:"CA certificate file to verify the NATS server"`
	NATSTLSCert   string `envconfig:"PLEG_NATS_TLS_CERT" desc:"Client certificate file for NATS mutual TLS"`
	NATSTLSKey    string `envconfig:"PLEG_NATS_TLS_KEY" desc:"Client key file for NATS mutual TLS"`
	DataDir       string `envconfig:"PLEG_DATA_DIR" default:"/var/lib/pleg-bridge" desc:"Data directory (the embedded NATS server's JetStream store)"`
	EmbeddedNATS  string `envconfig:"PLEG_EMBEDDED_NATS_LISTEN" default:"127.0.0.1:4222" desc:"Listen address of the embedded NATS server"`
	SubjectPrefix string `envconfig:"PLEG_SUBJECT_PREFIX" default:"pleg" desc:"First subject token(s): <prefix>.<node>.<podUID>.<eventType>"`

	Stream                string        `envconfig:"PLEG_STREAM" default:"PLEG" desc:"JetStream stream name"`
	StreamReplicas        int           `envconfig:"PLEG_STREAM_REPLICAS" default:"1" desc:"Stream replicas (1 on a single server, 3 in a cluster)"`
	StreamMaxAge          time.Duration `envconfig:"PLEG_STREAM_MAX_AGE" default:"168h" desc:"How long the stream keeps events (0: forever)"`
	StreamDuplicateWindow time.Duration `envconfig:"PLEG_STREAM_DUPLICATE_WINDOW" default:"2m" desc:"Window in which JetStream drops a repeated event ID"`
	StreamManage          bool          `envconfig:"PLEG_STREAM_MANAGE" default:"true" desc:"Create the stream if it is missing (false: leave it to the operator)"`

	CEMode      string `envconfig:"PLEG_CE_MODE" default:"structured" desc:"CloudEvents content mode: structured or binary"`
	ClusterName string `envconfig:"PLEG_CLUSTER_NAME" desc:"Cluster name; sets the CloudEvent source to /clusters/<cluster>/nodes/<node>"`

	Mode                string        `envconfig:"PLEG_MODE" default:"auto" desc:"auto, evented or generic"`
	RelistPeriod        time.Duration `envconfig:"PLEG_RELIST_PERIOD" default:"1s" desc:"Relist period in generic mode"`
	RelistThreshold     time.Duration `envconfig:"PLEG_RELIST_THRESHOLD" default:"3m" desc:"/healthz fails when the last relist is older than this"`
	EventedRelistPeriod time.Duration `envconfig:"PLEG_EVENTED_RELIST_PERIOD" default:"30s" desc:"Safety-net relist period while the event stream is healthy"`

	PublishMaxInFlight int           `envconfig:"PLEG_PUBLISH_MAX_IN_FLIGHT" default:"256" desc:"Published events awaiting a JetStream ack, at most"`
	OutboxSize         int           `envconfig:"PLEG_OUTBOX_SIZE" default:"16384" desc:"Events waiting for delivery, at most; the generator waits when it is full"`
	ShutdownTimeout    time.Duration `envconfig:"PLEG_SHUTDOWN_TIMEOUT" default:"10s" desc:"How long pending publishes may take to be acked at shutdown"`

	ListenAddress string `envconfig:"PLEG_LISTEN_ADDRESS" default:":9470" desc:"Address of /metrics, /healthz and /readyz (empty: off)"`
	LogLevel      string `envconfig:"PLEG_LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat     string `envconfig:"PLEG_LOG_FORMAT" default:"auto" desc:"auto (colour on a terminal, JSON otherwise), text or json"`
}

// loadConfig reads the configuration from the process environment and
// validates it. Errors name the variable at fault and the value it got.
func loadConfig() (Config, error) {
	var c Config
	if err := envconfig.Process("", &c); err != nil {
		var pe *envconfig.ParseError
		if errors.As(err, &pe) {
			return c, fmt.Errorf("%s=%q: %v", pe.KeyName, pe.Value, pe.Err)
		}
		return c, fmt.Errorf("read configuration: %w", err)
	}
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("PLEG_NODE_NAME is unset and the host name is unknown: %w", err)
		}
		c.NodeName = h
	}
	return c, c.validate()
}

func (c Config) validate() error {
	var errs []error
	bad := func(name string, value any, why string) {
		errs = append(errs, fmt.Errorf("PLEG_%s=%q: %s", name, fmt.Sprint(value), why))
	}
	if _, err := generator.ParseMode(c.Mode); err != nil {
		bad("MODE", c.Mode, "want auto, evented or generic")
	}
	if m := publish.Mode(c.CEMode); m != publish.ModeStructured && m != publish.ModeBinary {
		bad("CE_MODE", c.CEMode, "want structured or binary")
	}
	if err := schemas.ValidatePrefix(c.SubjectPrefix); err != nil {
		bad("SUBJECT_PREFIX", c.SubjectPrefix, "not a valid subject prefix: "+err.Error())
	}
	if c.CRIEndpoint != "" {
		if _, err := generator.ParseEndpoint(c.CRIEndpoint); err != nil {
			bad("CRI_ENDPOINT", c.CRIEndpoint, err.Error())
		}
	}
	if c.Stream == "" || strings.ContainsAny(c.Stream, ".*> \t\r\n/\\") {
		bad("STREAM", c.Stream, "a stream name must be non-empty without . * > / \\ or whitespace")
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
	if c.NATSToken != "" && c.NATSTokenFile != "" {
		bad("NATS_TOKEN_FILE", c.NATSTokenFile, "set PLEG_NATS_TOKEN or PLEG_NATS_TOKEN_FILE, not both")
	} else if c.NATSTokenFile != "" {
		if _, err := readToken(c.NATSTokenFile); err != nil {
			bad("NATS_TOKEN_FILE", c.NATSTokenFile, err.Error())
		}
	}
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		bad("NATS_TLS_CERT", c.NATSTLSCert, "PLEG_NATS_TLS_CERT and PLEG_NATS_TLS_KEY go together")
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		bad("LOG_LEVEL", c.LogLevel, "want debug, info, warn or error")
	}
	switch c.LogFormat {
	case "auto", "text", "json":
	default:
		bad("LOG_FORMAT", c.LogFormat, "want auto, text or json")
	}
	return errors.Join(errs...)
}

// printConfigHelp prints every variable with its default and description.
func printConfigHelp(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tDESCRIPTION")
	const format = `{{range .}}{{usage_key .}}	{{usage_default .}}	{{usage_description .}}
{{end}}`
	if err := envconfig.Usagef("", &Config{}, tw, format); err != nil {
		return err
	}
	return tw.Flush()
}
