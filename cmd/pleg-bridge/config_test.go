package main

import (
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/publish"
)

// lookupMap reads kv only; unlike envFrom it adds nothing.
func lookupMap(kv map[string]string) lookupFunc {
	return func(name string) (string, bool) {
		v, ok := kv[name]
		return v, ok
	}
}

// leafErrors flattens the tree errors.Join builds.
func leafErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leafErrors(e)...)
		}
		return out
	}
	return []error{err}
}

func TestConfigOfAnEmptyEnvironmentIsTheDefaults(t *testing.T) {
	t.Parallel()
	got, err := loadConfig(lookupMap(map[string]string{"PLEG_NODE_NAME": "node-1"}))
	if err != nil {
		t.Fatal(err)
	}
	want := defaultConfig()
	want.NodeName = "node-1"
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("config (-want +got):\n%s", d)
	}
}

func TestConfigReadsEachVariableAsItsDefaultIsWritten(t *testing.T) {
	t.Parallel()
	// Every field's type is one the loader reads, and the help's way of
	// writing a default reads back as the same value.
	def := reflect.ValueOf(defaultConfig())
	for _, f := range reflect.VisibleFields(def.Type()) {
		name, value := f.Tag.Get("env"), formatDefault(def.FieldByIndex(f.Index).Interface())
		got, err := loadConfig(lookupMap(map[string]string{"PLEG_NODE_NAME": "n", name: value}))
		if err != nil {
			t.Errorf("%s=%q (its default): %v", name, value, err)
			continue
		}
		if g, w := reflect.ValueOf(got).FieldByIndex(f.Index).Interface(), def.FieldByIndex(f.Index).Interface(); f.Name != "NodeName" && !reflect.DeepEqual(g, w) {
			t.Errorf("%s=%q read as %v, want %v", name, value, g, w)
		}
	}
}

func TestConfigParsesIntoTypedValues(t *testing.T) {
	t.Parallel()
	got, err := loadConfig(lookupMap(map[string]string{
		"PLEG_NODE_NAME":       "node-1",
		"PLEG_MODE":            "evented",
		"PLEG_CE_MODE":         "binary",
		"PLEG_LOG_LEVEL":       "DEBUG",
		"PLEG_LOG_FORMAT":      "json",
		"PLEG_SPOOL_MAX_BYTES": "0",
		"PLEG_STREAM_MANAGE":   "false",
		"PLEG_RELIST_PERIOD":   "250ms",
		"PLEG_LISTEN_ADDRESS":  "", // set but empty: the endpoint is off
		"PLEG_POD_ANNOTATIONS": " team, example.com/owner ,,",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := defaultConfig()
	want.NodeName = "node-1"
	want.Mode = generator.ModeEvented
	want.CEMode = publish.ModeBinary
	want.LogLevel = slog.LevelDebug
	want.LogFormat = logJSON
	want.SpoolMaxBytes = 0
	want.StreamManage = false
	want.RelistPeriod = 250 * time.Millisecond
	want.ListenAddress = ""
	want.PodAnnotations = []string{"team", "example.com/owner"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("config (-want +got):\n%s", d)
	}
}

func TestConfigReportsEveryErrorOnceNamingVariableAndValue(t *testing.T) {
	t.Parallel()
	_, err := loadConfig(lookupMap(map[string]string{
		"PLEG_MODE":            "fast",
		"PLEG_RELIST_PERIOD":   "soon",
		"PLEG_LOG_LEVEL":       "loud",
		"PLEG_SPOOL_MAX_BYTES": "-1",
		"PLEG_OUTBOX_SIZE":     "lots",
		"PLEG_STREAM":          "a.b",
		"PLEG_DATA_DIR":        "",
	}))
	if err == nil {
		t.Fatal("accepted")
	}
	var got []string
	for _, e := range leafErrors(err) {
		got = append(got, e.Error())
	}
	want := []string{
		`PLEG_DATA_DIR="": the embedded NATS server (PLEG_NATS_URL unset) keeps its store there; set both or PLEG_NATS_URL`,
		`PLEG_LOG_LEVEL="loud": want debug, info, warn or error`,
		`PLEG_MODE="fast": unknown mode "fast" (want auto, evented, containerd-events or generic)`,
		`PLEG_OUTBOX_SIZE="lots": not an integer`,
		`PLEG_RELIST_PERIOD="soon": not a duration (like 500ms, 30s or 3m)`,
		`PLEG_SPOOL_MAX_BYTES="-1": must not be negative (0: no spool)`,
		`PLEG_STREAM="a.b": a stream name must be non-empty without . * > / \ or whitespace`,
	}
	slices.Sort(got)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("errors (-want +got):\n%s", d)
	}
}

// TestConfigRefusesARepairThatCannotCoverTheServersFlush: a window
// shorter than nats-server's default sync_interval, or a byte bound too
// small to hold a window's events, is an error naming the variable; 0
// turns the repair off.
func TestConfigRefusesARepairThatCannotCoverTheServersFlush(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"PLEG_REPAIR_WINDOW": "30s"}, `PLEG_REPAIR_WINDOW="30s": must be at least 2m, nats-server's default sync_interval, which a power loss can lose (0: no repair)`},
		{map[string]string{"PLEG_REPAIR_WINDOW": "-1m"}, `PLEG_REPAIR_WINDOW="-1m0s": must be at least 2m, nats-server's default sync_interval, which a power loss can lose (0: no repair)`},
		{map[string]string{"PLEG_REPAIR_MAX_BYTES": "1000"}, `PLEG_REPAIR_MAX_BYTES="1000": must be at least 1048576 to hold PLEG_REPAIR_WINDOW of acknowledged events`},
	} {
		_, err := loadConfig(lookupMap(c.env))
		if err == nil {
			t.Errorf("%v accepted", c.env)
			continue
		}
		var got []string
		for _, e := range leafErrors(err) {
			got = append(got, e.Error())
		}
		if d := cmp.Diff([]string{c.want}, got); d != "" {
			t.Errorf("%v: errors (-want +got):\n%s", c.env, d)
		}
	}
	for window, want := range map[string]time.Duration{"0": -1, "10m": 10 * time.Minute} {
		c, err := loadConfig(lookupMap(map[string]string{"PLEG_REPAIR_WINDOW": window}))
		if err != nil {
			t.Fatalf("PLEG_REPAIR_WINDOW=%s: %v", window, err)
		}
		if got := c.bridgeOptions(nil, nil).RepairWindow; got != want {
			t.Errorf("PLEG_REPAIR_WINDOW=%s: bridge.Options.RepairWindow = %v, want %v", window, got, want)
		}
	}
}

// FuzzLoadConfig sets the variables to arbitrary values: loading never
// panics, and every error it reports names a PLEG_ variable. The fuzzed
// string holds the values one per line, in field order, for as many
// variables as it has lines; PLEG_NATS_TOKEN_FILE is left out, because
// validation reads the file it names (a fuzzer's /dev/zero would never end).
func FuzzLoadConfig(f *testing.F) {
	f.Add("")
	f.Add("node-1\nunix:///run/containerd/containerd.sock\n30s\n67108864")
	f.Add(strings.Repeat("\n", 20) + "fast\n-1s\n0s")
	f.Add(strings.Repeat("x\n", 40))
	f.Add(strings.Repeat("-1\n", 40))
	f.Add(strings.Repeat("\xff\x00.*>\n", 40))
	names := configNames()
	f.Fuzz(func(t *testing.T, values string) {
		env := map[string]string{}
		for i, v := range strings.Split(values, "\n") {
			if i < len(names) && names[i] != "PLEG_NATS_TOKEN_FILE" {
				env[names[i]] = v
			}
		}
		_, err := loadConfig(lookupMap(env))
		if err == nil {
			return
		}
		for _, e := range leafErrors(err) {
			if !strings.Contains(e.Error(), envPrefix) {
				t.Errorf("error %q names no %s variable", e, envPrefix)
			}
		}
	})
}

func TestConfigNamesPodAnnotationKeysThatCannotBe(t *testing.T) {
	t.Parallel()
	_, err := loadConfig(lookupMap(map[string]string{
		"PLEG_NODE_NAME":       "n",
		"PLEG_POD_ANNOTATIONS": "team,last applied,Example.com/x,team,example.com/,a.b-c_d/e",
	}))
	var got []string
	for _, e := range leafErrors(err) {
		got = append(got, e.Error())
	}
	const v = `PLEG_POD_ANNOTATIONS="team,last applied,Example.com/x,team,example.com/,a.b-c_d/e": `
	const shape = ` is not an annotation key ([<DNS subdomain>/]<name>, the name at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)`
	want := []string{
		v + `"last applied"` + shape,
		v + `"Example.com/x"` + shape,
		v + `"team" is named twice`,
		v + `"example.com/"` + shape,
		v + `"a.b-c_d/e"` + shape,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("errors (-want +got):\n%s", d)
	}

	c, err := loadConfig(lookupMap(map[string]string{"PLEG_NODE_NAME": "n",
		"PLEG_POD_ANNOTATIONS": "team,kubernetes.io/change-cause,app.example.com/owner.v2"}))
	if err != nil {
		t.Fatalf("valid keys refused: %v", err)
	}
	if got := c.bridgeOptions(nil, nil).PodAnnotations; !slices.Equal(got, []string{"team", "kubernetes.io/change-cause", "app.example.com/owner.v2"}) {
		t.Errorf("bridge options carry pod annotations %q", got)
	}
}

func TestConfigParseErrorsSayTheAcceptedValuesAndHideNoOtherError(t *testing.T) {
	t.Parallel()
	// One value of each parsed type that does not parse, next to values
	// that parse but are wrong, alone or against another variable.
	_, err := loadConfig(lookupMap(map[string]string{
		"PLEG_NODE_NAME":             "n",
		"PLEG_STREAM_MANAGE":         "yes",
		"PLEG_STREAM_REPLICAS":       "three",
		"PLEG_SPOOL_MAX_BYTES":       "1GiB",
		"PLEG_STREAM_MAX_AGE":        "7d",
		"PLEG_CE_MODE":               "json",
		"PLEG_LOG_FORMAT":            "pretty",
		"PLEG_RELIST_PERIOD":         "5m",
		"PLEG_RELIST_THRESHOLD":      "1m",
		"PLEG_STATE_BUCKET":          "a.b",
		"PLEG_NATS_TLS_CERT":         "/tls/cert.pem",
		"PLEG_NATS_CREDS":            "/nats/node.creds",
		"PLEG_NATS_NKEY_SEED":        "/nats/node.nk",
		"PLEG_OUTBOX_SIZE":           "10",
		"PLEG_SUBJECT_PREFIX":        "pleg.>",
		"PLEG_CRI_MAX_RECV_MSG_SIZE": "0x10",
	}))
	var got []string
	for _, e := range leafErrors(err) {
		got = append(got, e.Error())
	}
	slices.Sort(got)
	want := []string{
		`PLEG_CE_MODE="json": want structured or binary`,
		`PLEG_CRI_MAX_RECV_MSG_SIZE="16": want at least 4194304`,
		`PLEG_LOG_FORMAT="pretty": want auto, text or json`,
		`PLEG_NATS_NKEY_SEED="/nats/node.nk": set PLEG_NATS_CREDS or PLEG_NATS_NKEY_SEED, not both: a credentials file holds its own NKey seed`,
		`PLEG_NATS_TLS_CERT="/tls/cert.pem": PLEG_NATS_TLS_CERT and PLEG_NATS_TLS_KEY go together`,
		`PLEG_OUTBOX_SIZE="10": must be at least PLEG_PUBLISH_MAX_IN_FLIGHT`,
		`PLEG_RELIST_THRESHOLD="1m0s": must be longer than PLEG_RELIST_PERIOD`,
		`PLEG_SPOOL_MAX_BYTES="1GiB": not an integer`,
		`PLEG_STATE_BUCKET="a.b": a bucket name holds only letters, digits, - and _ (empty: no state bucket)`,
		`PLEG_STREAM_MANAGE="yes": want true or false`,
		`PLEG_STREAM_MAX_AGE="7d": not a duration (like 500ms, 30s or 3m)`,
		`PLEG_STREAM_REPLICAS="three": not an integer`,
		`PLEG_SUBJECT_PREFIX="pleg.>": not a valid subject prefix: invalid subject prefix "pleg.>": wildcard '>'`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("errors (-want +got):\n%s", d)
	}
	for _, e := range got {
		if strings.Contains(e, "strconv.") || strings.Contains(e, "time: ") {
			t.Errorf("error %q quotes a parser instead of saying what is accepted", e)
		}
	}
}

func TestUnknownVariablesNameTheClosestKnownOne(t *testing.T) {
	t.Parallel()
	got := unknownVariables([]string{
		"HOME=/root",
		"PLEG_MODE=generic", // known
		"PLEG_MOD=generic",
		"PLEG_NATS_URLS=nats://n:4222",
		"PLEG_LOGLEVEL=debug",
		"PLEG_DATADIR=/tmp/x",
		"PLEG_E2E_VERSIONS=2.0", // the test harness's, not a typo
		"PLEG_BENCH_RUNTIME=containerd",
		"NOT_PLEG_MODE=x",
	})
	want := []unknownVariable{
		{"PLEG_DATADIR", "PLEG_DATA_DIR"},
		{"PLEG_LOGLEVEL", "PLEG_LOG_LEVEL"},
		{"PLEG_MOD", "PLEG_MODE"},
		{"PLEG_NATS_URLS", "PLEG_NATS_URL"},
	}
	if d := cmp.Diff(want, got, cmp.AllowUnexported(unknownVariable{})); d != "" {
		t.Errorf("unknown variables (-want +got):\n%s", d)
	}
	if got := unknownVariables(nil); got != nil {
		t.Errorf("an empty environment has unknown variables %v", got)
	}
}

func TestEditDistance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "abc", 3}, {"abc", "", 3}, {"PLEG_MODE", "PLEG_MODE", 0},
		{"PLEG_MOD", "PLEG_MODE", 1}, {"PLEG_MDOE", "PLEG_MODE", 2}, {"kitten", "sitting", 3},
	} {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := editDistance(c.b, c.a); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.b, c.a, got, c.want)
		}
	}
}

// TestModeErrorIsTheParsers: a PLEG_MODE that does not parse reports the
// parser's own error, which names every mode (containerd-events included),
// not a list of its own that falls behind.
func TestModeErrorIsTheParsers(t *testing.T) {
	t.Parallel()
	_, err := loadConfig(lookupMap(map[string]string{"PLEG_MODE": "fast"}))
	_, perr := generator.ParseMode("fast")
	if perr == nil {
		t.Fatal("generator.ParseMode accepted fast")
	}
	want := `PLEG_MODE="fast": ` + perr.Error()
	var got []string
	for _, e := range leafErrors(err) {
		got = append(got, e.Error())
	}
	if !slices.Contains(got, want) {
		t.Errorf("errors %q, want one that is %q", got, want)
	}
	for _, m := range []generator.Mode{generator.ModeAuto, generator.ModeEvented, generator.ModeContainerdEvents, generator.ModeGeneric} {
		if !strings.Contains(want, string(m)) {
			t.Errorf("the mode error %q does not name %s", want, m)
		}
	}
}

func TestConfigRefusesAnArchiveThatKeepsLessThanTheStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{
			"a negative max age",
			map[string]string{"PLEG_ARCHIVE_MAX_AGE": "-1h"},
			`PLEG_ARCHIVE_MAX_AGE="-1h0m0s": must not be negative (0: no archive)`,
		},
		{
			"a max age shorter than the stream's",
			map[string]string{"PLEG_ARCHIVE_MAX_AGE": "24h", "PLEG_STREAM_MAX_AGE": "48h"},
			`PLEG_ARCHIVE_MAX_AGE="24h0m0s": must be at least PLEG_STREAM_MAX_AGE (48h0m0s): the archive keeps the stream's events longer`,
		},
		{
			"an archive of a stream kept forever",
			map[string]string{"PLEG_ARCHIVE_MAX_AGE": "168h", "PLEG_STREAM_MAX_AGE": "0"},
			`PLEG_ARCHIVE_MAX_AGE="168h0m0s": PLEG_STREAM_MAX_AGE=0 keeps events forever: an archive would keep them for less; set PLEG_STREAM_MAX_AGE shorter, or no archive`,
		},
		{
			"an archive the bridge may not manage",
			map[string]string{"PLEG_ARCHIVE_MAX_AGE": "168h", "PLEG_STREAM_MAX_AGE": "24h", "PLEG_STREAM_MANAGE": "false"},
			`PLEG_ARCHIVE_MAX_AGE="168h0m0s": needs PLEG_STREAM_MANAGE=true: the bridge creates and keeps the archive`,
		},
		{
			"an archive named as the stream",
			map[string]string{"PLEG_ARCHIVE_STREAM": "PLEG"},
			`PLEG_ARCHIVE_STREAM="PLEG": an archive stream name must be without . * > / \ or whitespace, and not PLEG_STREAM's`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"PLEG_NODE_NAME": "node-1"}
			maps.Copy(env, tc.env)
			_, err := loadConfig(lookupMap(env))
			if err == nil {
				t.Fatal("accepted")
			}
			var got []string
			for _, e := range leafErrors(err) {
				got = append(got, e.Error())
			}
			if d := cmp.Diff([]string{tc.want}, got); d != "" {
				t.Errorf("errors (-want +got):\n%s", d)
			}
		})
	}
}

func TestConfigPassesTheArchiveToTheBridge(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(lookupMap(map[string]string{
		"PLEG_NODE_NAME": "node-1", "PLEG_STREAM_MAX_AGE": "24h", "PLEG_ARCHIVE_MAX_AGE": "168h",
	}))
	if err != nil {
		t.Fatal(err)
	}
	so := c.bridgeOptions(slog.New(slog.DiscardHandler), nil).Stream
	if so.ArchiveMaxAge != 168*time.Hour || so.MaxAge != 24*time.Hour || so.ArchiveName != "" {
		t.Errorf("bridge stream options: archive max age %s, max age %s, archive name %q", so.ArchiveMaxAge, so.MaxAge, so.ArchiveName)
	}
}
