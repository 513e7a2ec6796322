package layers

// Patterns name packages: a path relative to the module root ("generator")
// for the module's own packages, a full import path for others, and a
// trailing "/..." for a package and everything below it.
var (
	// criAPI is the CRI API and containerd's API, the runtime's side of the
	// wire.
	criAPI = []string{"k8s.io/cri-api/...", "github.com/containerd/..."}
	// natsLibs are NATS's client, server, JWT and key libraries.
	natsLibs    = "github.com/nats-io/..."
	natsClient  = "github.com/nats-io/nats.go/..."
	natsServer  = "github.com/nats-io/nats-server/..."
	grpc        = "google.golang.org/grpc/..."
	protobuf    = "google.golang.org/protobuf/..."
	cloudEvents = "github.com/cloudevents/..."
	prometheus  = "github.com/prometheus/client_golang/..."
	commands    = "cmd/..."
	// harness is the test harness: soak, fleet, the benchmarks and their
	// commands.
	harness = "harness/..."

	// stdlibOnly, as a rule's externals, allows the standard library alone.
	stdlibOnly = []string{}
	// testsOnly, as a rule's importedBy, allows no package but test files.
	testsOnly = []string{}
)

// rules is what each package's doc.go says it may and must not import, one
// entry per doc.go, in the order of the paths. The prose is the source: a
// change here goes with the same change to the doc.go.
var rules = []rule{
	{
		pkg:           "bridge",
		may:           []string{"cri", "datadir", "generator", "natsauth", "natsembed", "publish", "schemas", "statebucket"},
		mustNotImport: []string{commands, "crisim"},
		importedBy:    []string{"harness/latencybench", "harness/cmd/pleg-bench", "cmd/pleg-bridge", "harness/fleet"},
	},
	{
		pkg:         "cmd/pleg-bridge",
		mustNotLink: []string{harness},
	},
	{
		pkg:         "consumer",
		may:         []string{"schemas"},
		externals:   []string{natsClient},
		mustNotLink: append([]string{grpc, cloudEvents}, criAPI...),
	},
	{
		pkg:           "cri",
		may:           []string{"generator", "internal/taskevent"},
		mustNotImport: []string{"publish", natsLibs, commands},
	},
	{
		pkg:           "crisim",
		may:           []string{},
		externals:     append([]string{grpc, protobuf}, criAPI...),
		mustNotImport: []string{"cri", "generator", "statecache", "publish", commands},
	},
	{
		pkg:           "datadir",
		may:           []string{"generator", "internal/jsonenc"},
		externals:     []string{"go.etcd.io/bbolt/..."},
		mustNotImport: append([]string{natsLibs, "publish", "bridge", commands}, criAPI...),
	},
	{
		pkg:           "generator",
		may:           []string{"statecache"},
		mustNotImport: []string{"cri", "publish", natsLibs, commands},
	},
	{
		pkg:           "generator/generatortest",
		may:           []string{"generator", "crisim", "internal/taskevent"},
		mustNotImport: []string{"cri"},
		importedBy:    testsOnly,
	},
	{
		pkg:           "harness/fleet",
		may:           []string{"bridge", "consumer", "crisim", "generator", "publish", "schemas", "harness/proc", "harness/soak"},
		mustNotImport: []string{commands},
		importedBy:    []string{"harness/cmd/pleg-harness"},
	},
	{
		pkg:        "harness/latencybench",
		may:        []string{"bridge", "crisim", "generator", "harness/proc", "natsembed", "publish", "schemas"},
		importedBy: []string{"harness/cmd/pleg-bench"},
	},
	{
		pkg:        "harness/proc",
		may:        []string{},
		externals:  stdlibOnly,
		importedBy: []string{"harness/cmd/pleg-bench", "harness/fleet", "harness/latencybench", "harness/soak"},
	},
	{
		pkg:         "harness/soak",
		may:         []string{"consumer", "crisim", "harness/proc", "natsembed"},
		mustNotLink: []string{"cri", "generator", "statecache", "publish", "datadir", "bridge", commands},
		importedBy:  []string{"harness/cmd/pleg-harness", "harness/fleet"},
	},
	{
		pkg:        "internal/cli",
		may:        []string{},
		externals:  []string{"github.com/spf13/cobra/...", "github.com/spf13/pflag/...", "github.com/lmittmann/tint/...", "github.com/mattn/go-isatty/...", "golang.org/x/sys/..."},
		importedBy: []string{"cmd/pleg-bridge", "harness/cmd/pleg-harness"},
	},
	{
		pkg:        "internal/layers",
		may:        []string{},
		importedBy: []string{},
	},
	{
		pkg:       "internal/logtest",
		may:       []string{},
		externals: stdlibOnly,
	},
	{
		pkg:           "internal/taskevent",
		may:           []string{"generator"},
		mustNotImport: []string{"cri", natsLibs, commands},
		importedBy:    []string{"cri", "generator/generatortest"},
	},
	{
		pkg:       "internal/waittest",
		may:       []string{},
		externals: stdlibOnly,
	},
	{
		pkg:        "natsauth",
		may:        []string{"consumer", "schemas"},
		externals:  []string{"github.com/nats-io/jwt/...", "github.com/nats-io/nkeys/..."},
		importedBy: []string{"bridge", "cmd/pleg-bridge", "natsauth/natsauthtest"},
	},
	{
		pkg:           "natsembed",
		may:           []string{},
		externals:     []string{natsServer},
		mustNotImport: append([]string{"publish", "generator", "cri"}, criAPI...),
	},
	{
		pkg:           "publish",
		may:           []string{"consumer", "datadir", "generator", "internal/jsonenc", "schemas"},
		mustNotImport: append([]string{grpc, "cri", "statebucket", "natsembed", natsServer}, criAPI...),
	},
	{
		pkg:           "schemas",
		may:           []string{},
		externals:     stdlibOnly,
		mustNotImport: append([]string{grpc, natsLibs}, criAPI...),
	},
	{
		pkg:        "schemas/schemastest",
		may:        []string{"schemas"},
		importedBy: testsOnly,
	},
	{
		pkg:           "statebucket",
		may:           []string{"generator", "publish", "schemas"},
		externals:     []string{natsClient, prometheus},
		mustNotImport: append([]string{grpc, "datadir"}, criAPI...),
	},
	{
		pkg:           "statecache",
		may:           []string{},
		externals:     stdlibOnly,
		mustNotImport: append([]string{"generator", "publish", "schemas", natsLibs}, criAPI...),
	},
}

// knownViolations are arrows that break a rule above today and are being
// fixed elsewhere. TestImportRules logs them rather than failing, and fails
// once one is gone, so that its entry goes with it. Keep this list empty:
// add to it only an arrow whose fix is under way, with the reason.
var knownViolations = []knownViolation{}
