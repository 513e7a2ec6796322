package main

import (
	"log/slog"
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

// configNames lists the variable of every Config field, in field order.
func configNames() []string {
	var names []string
	for _, f := range reflect.VisibleFields(reflect.TypeFor[Config]()) {
		names = append(names, f.Tag.Get("env"))
	}
	return names
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
		`PLEG_MODE="fast": want auto, evented or generic`,
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
