package main

// Validation of the deployment files (Dockerfile, docker-compose.yml,
// deploy/kubernetes, deploy/nats) against the code: the subcommands they run,
// the PLEG_* variables they set (names and values), the ports and paths they
// wire together, and the NATS permissions, exercised on a real server. None
// of it needs Docker or a cluster.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/pleg-bridge/pleg-bridge/cri"
	"github.com/pleg-bridge/pleg-bridge/generator"
	"github.com/pleg-bridge/pleg-bridge/natsauth"
	"github.com/pleg-bridge/pleg-bridge/publish"
	"github.com/pleg-bridge/pleg-bridge/publish/publishtest"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found at %s: %v", root, err)
	}
	return root
}

// configVariables is the set of variable names Config reads: the env tag of
// each field.
func configVariables(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	typ := reflect.TypeFor[Config]()
	for f := range typ.Fields() {
		tag := f.Tag.Get("env")
		if tag == "" {
			t.Fatalf("Config.%s has no env tag", f.Name)
		}
		if !strings.HasPrefix(tag, envPrefix) {
			t.Fatalf("Config.%s reads %s, which lacks the %s prefix", f.Name, tag, envPrefix)
		}
		names[tag] = true
	}
	return names
}

// goRuntimeVariables are the non-PLEG variables a manifest may set: the Go
// runtime's own.
var goRuntimeVariables = map[string]bool{"GOMEMLIMIT": true, "GOMAXPROCS": true, "GODEBUG": true}

// isSubcommand reports whether run knows cmd, by asking for its help.
func isSubcommand(t *testing.T, cmd string) bool {
	t.Helper()
	if strings.HasPrefix(cmd, "-") || cmd == "help" {
		return false
	}
	err := run(t.Context(), []string{cmd, "--help"}, envFrom(t, nil), io.Discard, io.Discard)
	return err == nil || !strings.Contains(err.Error(), "unknown command")
}

func TestSubcommandsTheDeploymentFilesUseExist(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "demo", "tail", "replay", "simulate", "version"} {
		if !isSubcommand(t, cmd) {
			t.Errorf("%s is not a pleg-bridge subcommand", cmd)
		}
	}
	if isSubcommand(t, "serve") {
		t.Error("isSubcommand accepts an unknown command")
	}
}

// validateEnv checks that env (a manifest's variables) names only Config
// variables and Go runtime settings, and that run would accept the values:
// the PLEG_* variables go through loadConfig. Values a manifest takes from
// elsewhere (downward API, Secrets) are nil in env and replaced by stand-ins.
func validateEnv(t *testing.T, where string, env map[string]*string) {
	t.Helper()
	known := configVariables(t)
	set := map[string]string{}
	for name, v := range env {
		switch {
		case known[name]:
		case goRuntimeVariables[name]:
			continue
		default:
			t.Errorf("%s sets %s, which pleg-bridge does not read (known: PLEG_* of Config)", where, name)
			continue
		}
		value := "stand-in"
		switch {
		case v != nil:
			value = *v
		case name == "PLEG_NATS_URL":
			value = "nats://nats.example:4222"
		}
		set[name] = value
	}
	if _, err := loadConfig(envFrom(t, set)); err != nil {
		t.Errorf("%s: pleg-bridge run would refuse its configuration:\n%v", where, err)
	}
}

// listenPort is the port of a PLEG_LISTEN_ADDRESS value.
func listenPort(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("PLEG_LISTEN_ADDRESS=%q: %v", addr, err)
	}
	return port
}

// --- docker-compose.yml ---

func loadCompose(t *testing.T, env []string, profiles ...string) *types.Project {
	t.Helper()
	root := repoRoot(t)
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root),
		cli.WithEnv(env), // no process environment: the file's defaults apply
		cli.WithProfiles(profiles),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(t.Context())
	if err != nil {
		t.Fatalf("load docker-compose.yml (profiles %q): %v", profiles, err)
	}
	return p
}

func TestComposeProfilesSelectTheDocumentedServices(t *testing.T) {
	t.Parallel()
	tests := []struct {
		profiles []string
		want     []string
	}{
		{nil, []string{"nats"}},
		{[]string{"host"}, []string{"nats", "pleg-bridge", "tail"}},
		{[]string{"sim"}, []string{"crisim", "nats", "pleg-bridge-sim", "tail"}},
		{[]string{"*"}, []string{"crisim", "nats", "pleg-bridge", "pleg-bridge-sim", "tail"}},
	}
	for _, tt := range tests {
		p := loadCompose(t, nil, tt.profiles...)
		got := p.ServiceNames()
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("profiles %q start %q, want %q", tt.profiles, got, tt.want)
		}
	}
}

func TestComposeServicesRunOurImageWithKnownCommandsAndVariables(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	p := loadCompose(t, nil, "*")
	ours := 0
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if s.Build == nil {
			continue
		}
		ctxDir := s.Build.Context
		if !filepath.IsAbs(ctxDir) {
			ctxDir = filepath.Join(root, ctxDir)
		}
		dockerfile := s.Build.Dockerfile
		if dockerfile == "" {
			dockerfile = "Dockerfile"
		}
		if !filepath.IsAbs(dockerfile) {
			dockerfile = filepath.Join(ctxDir, dockerfile)
		}
		if _, err := os.Stat(dockerfile); err != nil {
			t.Errorf("service %s: build context %s has no %s: %v", name, s.Build.Context, s.Build.Dockerfile, err)
			continue
		}
		if filepath.Clean(ctxDir) != root {
			continue // not our image
		}
		ours++
		if len(s.Entrypoint) != 0 {
			t.Errorf("service %s overrides the image's entrypoint with %q", name, s.Entrypoint)
		}
		if len(s.Command) == 0 || !isSubcommand(t, s.Command[0]) {
			t.Errorf("service %s: command %q does not start with a pleg-bridge subcommand", name, s.Command)
		}
		validateEnv(t, "docker-compose service "+name, map[string]*string(s.Environment))
		if !s.ReadOnly {
			t.Errorf("service %s: want read_only: true", name)
		}
	}
	if ours < 4 {
		t.Errorf("%d services use the pleg-bridge image, want pleg-bridge, crisim, pleg-bridge-sim and tail", ours)
	}
	for _, name := range p.ServiceNames() {
		for k := range p.Services[name].Environment {
			if strings.HasPrefix(k, envPrefix+"_") && !configVariables(t)[k] {
				t.Errorf("service %s sets unknown %s", name, k)
			}
		}
	}
}

func TestComposeWiresSocketsDataAndPorts(t *testing.T) {
	t.Parallel()
	p := loadCompose(t, nil, "*")
	env := func(s types.ServiceConfig, k string) string {
		if v := s.Environment[k]; v != nil {
			return *v
		}
		return ""
	}
	// mountOf returns the volume of s whose target is path or a parent of it.
	mountOf := func(s types.ServiceConfig, path string) (types.ServiceVolumeConfig, bool) {
		for _, v := range s.Volumes {
			if v.Target == path || strings.HasPrefix(path, strings.TrimSuffix(v.Target, "/")+"/") {
				return v, true
			}
		}
		return types.ServiceVolumeConfig{}, false
	}
	for _, name := range []string{"pleg-bridge", "pleg-bridge-sim"} {
		s := p.Services[name]
		if got := s.User; got != "0:0" {
			t.Errorf("%s runs as %q, want 0:0 to open the root-owned CRI socket", name, got)
		}
		sock, err := cri.ParseEndpoint(env(s, "PLEG_CRI_ENDPOINT"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, ok := mountOf(s, sock); !ok {
			t.Errorf("%s: no volume holds the CRI socket %s", name, sock)
		}
		if _, ok := mountOf(s, env(s, "PLEG_DATA_DIR")); !ok {
			t.Errorf("%s: PLEG_DATA_DIR=%s is not a volume, and the root filesystem is read-only", name, env(s, "PLEG_DATA_DIR"))
		}
		port := listenPort(t, env(s, "PLEG_LISTEN_ADDRESS"))
		if !slices.ContainsFunc(s.Ports, func(pc types.ServicePortConfig) bool { return pc.Target == mustAtoi(t, port) }) {
			t.Errorf("%s publishes %v, not its metrics port %s", name, s.Ports, port)
		}
		if d, ok := s.DependsOn["nats"]; !ok || d.Condition != types.ServiceConditionHealthy {
			t.Errorf("%s does not wait for nats to be healthy: %+v", name, s.DependsOn)
		}
	}

	host := p.Services["pleg-bridge"]
	v, _ := mountOf(host, "/run/containerd/containerd.sock")
	if v.Type != types.VolumeTypeBind || !v.ReadOnly || v.Source != "/run/containerd/containerd.sock" {
		t.Errorf("pleg-bridge: the host socket is not bound read-only from /run/containerd/containerd.sock: %+v", v)
	}
	if v.Bind == nil || v.Bind.CreateHostPath {
		t.Errorf("pleg-bridge: a missing host socket must fail, not become a directory: %+v", v.Bind)
	}
	if got := env(host, "PLEG_NODE_NAME"); got != "laptop" {
		t.Errorf("PLEG_NODE_NAME without HOSTNAME = %q, want laptop", got)
	}
	if got := env(loadCompose(t, []string{"HOSTNAME=dev-1"}, "host").Services["pleg-bridge"], "PLEG_NODE_NAME"); got != "dev-1" {
		t.Errorf("PLEG_NODE_NAME with HOSTNAME=dev-1 = %q", got)
	}

	// The simulated runtime serves its socket in the volume the sim bridge
	// reads it from.
	sim, bridge := p.Services["crisim"], p.Services["pleg-bridge-sim"]
	i := slices.Index(sim.Command, "--socket")
	if i < 0 || i+1 >= len(sim.Command) {
		t.Fatalf("crisim command %q has no --socket", sim.Command)
	}
	simSock := sim.Command[i+1]
	bridgeSock, _ := cri.ParseEndpoint(env(bridge, "PLEG_CRI_ENDPOINT"))
	sv, ok1 := mountOf(sim, simSock)
	bv, ok2 := mountOf(bridge, bridgeSock)
	if simSock != bridgeSock || !ok1 || !ok2 || sv.Source != bv.Source || sv.Type != types.VolumeTypeVolume {
		t.Errorf("crisim serves %s (volume %+v) but pleg-bridge-sim reads %s (volume %+v)", simSock, sv, bridgeSock, bv)
	}

	nats := p.Services["nats"]
	if nats.HealthCheck == nil || !strings.Contains(strings.Join(nats.HealthCheck.Test, " "), "healthz?js-enabled-only=true") {
		t.Errorf("nats healthcheck %+v does not wait for JetStream", nats.HealthCheck)
	}
	if !slices.Contains(nats.Command, "-js") {
		t.Errorf("nats command %q does not enable JetStream", nats.Command)
	}
	tail := p.Services["tail"]
	if i := slices.Index(tail.Command, "--nats-url"); i < 0 || tail.Command[i+1] != env(host, "PLEG_NATS_URL") {
		t.Errorf("tail %q does not follow the bridge's NATS %s", tail.Command, env(host, "PLEG_NATS_URL"))
	}
}

func mustAtoi(t *testing.T, s string) uint32 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		t.Fatalf("port %q: %v", s, err)
	}
	return uint32(n)
}

// --- Dockerfile ---

func TestDockerfileBuildsTheBinaryAndRunsItAsNonRoot(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var instructions []string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			instructions = append(instructions, line)
		}
	}
	df := strings.Join(instructions, "\n")
	for _, want := range []string{
		"ARG VERSION=dev",
		`-X main.version=${VERSION}`,
		"CGO_ENABLED=0",
		"./cmd/pleg-bridge",
		"USER 65532:65532",
		"EXPOSE 9470",
		`ENTRYPOINT ["/pleg-bridge"]`,
		`CMD ["run"]`,
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(repoRoot(t), "cmd", "pleg-bridge", "main.go")); err != nil {
		t.Errorf("the Dockerfile builds ./cmd/pleg-bridge: %v", err)
	}
	if port := listenPort(t, defaultConfig().ListenAddress); !strings.Contains(df, "EXPOSE "+port) {
		t.Errorf("the Dockerfile does not expose the default PLEG_LISTEN_ADDRESS port %s", port)
	}
	ignore, err := os.ReadFile(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(ignore)) {
		line = strings.TrimSpace(line)
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "schemas", "*.go", "**/*.go"} {
			if line == needed || line == "/"+needed {
				t.Errorf(".dockerignore excludes %s, which the build needs", needed)
			}
		}
	}
}

// --- deploy/kubernetes ---

// podMonitor is the part of the Prometheus Operator's PodMonitor the
// manifest uses.
type podMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		JobLabel            string               `json:"jobLabel"`
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// kustomization is the part of a kustomize Kustomization the manifest uses.
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string            `json:"namespace"`
	CommonLabels    map[string]string `json:"commonLabels"`
	Labels          []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors"`
		IncludeTemplates bool              `json:"includeTemplates"`
	} `json:"labels"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
		Digest  string `json:"digest"`
	} `json:"images"`
}

// manifestKind returns the apiVersion of a kind the deployment files use,
// and a new object of its type; obj is nil for any other kind.
func manifestKind(kind string) (want struct {
	apiVersion string
	obj        any
}) {
	switch kind {
	case "Namespace":
		want.apiVersion, want.obj = "v1", &corev1.Namespace{}
	case "ServiceAccount":
		want.apiVersion, want.obj = "v1", &corev1.ServiceAccount{}
	case "Secret":
		want.apiVersion, want.obj = "v1", &corev1.Secret{}
	case "DaemonSet":
		want.apiVersion, want.obj = "apps/v1", &appsv1.DaemonSet{}
	case "PodMonitor":
		want.apiVersion, want.obj = "monitoring.coreos.com/v1", &podMonitor{}
	case "PrometheusRule":
		want.apiVersion, want.obj = "monitoring.coreos.com/v1", &prometheusRule{}
	case "Kustomization":
		want.apiVersion, want.obj = "kustomize.config.k8s.io/v1beta1", &kustomization{}
	}
	return want
}

// k8sManifests decodes every YAML file of deploy/kubernetes strictly into
// the type of its kind, keyed by file name.
func k8sManifests(t *testing.T) map[string]any {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy", "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.y*ml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	out := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("\n---")) {
			t.Errorf("%s: one object per file, please", filepath.Base(f))
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(b, &tm); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		want := manifestKind(tm.Kind)
		if want.obj == nil {
			t.Errorf("%s: unexpected kind %q", filepath.Base(f), tm.Kind)
			continue
		}
		if tm.APIVersion != want.apiVersion {
			t.Errorf("%s: apiVersion %q, want %q", filepath.Base(f), tm.APIVersion, want.apiVersion)
		}
		if err := yaml.UnmarshalStrict(b, want.obj); err != nil {
			t.Errorf("%s does not decode strictly as a %s: %v", filepath.Base(f), tm.Kind, err)
			out[filepath.Base(f)] = nil // listed, but not to be checked further
			continue
		}
		out[filepath.Base(f)] = want.obj
	}
	return out
}

func TestKubernetesKustomizationListsEveryManifestButTheExampleSecret(t *testing.T) {
	t.Parallel()
	m := k8sManifests(t)
	k, ok := m["kustomization.yaml"].(*kustomization)
	if !ok {
		t.Fatal("deploy/kubernetes/kustomization.yaml is missing or invalid")
	}
	var want []string
	for name := range m {
		if name != "kustomization.yaml" && name != "secret.example.yaml" {
			want = append(want, name)
		}
	}
	got := slices.Clone(k.Resources)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("kustomization resources %q, want every manifest but the example secret: %q", k.Resources, want)
	}
	if slices.Contains(k.Resources, "secret.example.yaml") {
		t.Error("the example secret must not be applied")
	}
	labelled := k.CommonLabels["app.kubernetes.io/name"] == "pleg-bridge"
	for _, l := range k.Labels {
		labelled = labelled || l.Pairs["app.kubernetes.io/name"] == "pleg-bridge"
	}
	if !labelled {
		t.Error("kustomization does not label everything app.kubernetes.io/name=pleg-bridge")
	}
	for name, obj := range m {
		var ns string
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			ns = o.Namespace
		case *corev1.Secret:
			ns = o.Namespace
		case *appsv1.DaemonSet:
			ns = o.Namespace
		case *podMonitor:
			ns = o.Metadata.Namespace
		case *prometheusRule:
			ns = o.Metadata.Namespace
		case *corev1.Namespace:
			ns = o.Name
		default:
			continue
		}
		if ns != k.Namespace {
			t.Errorf("%s is in namespace %q, want %q", name, ns, k.Namespace)
		}
	}
	if sa, _ := m["serviceaccount.yaml"].(*corev1.ServiceAccount); sa == nil || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Error("the service account automounts its token; the bridge needs no API access")
	}
}

func TestKubernetesDaemonSetIsWiredAndLockedDown(t *testing.T) {
	t.Parallel()
	m := k8sManifests(t)
	ds, ok := m["daemonset.yaml"].(*appsv1.DaemonSet)
	if !ok {
		t.Fatal("deploy/kubernetes/daemonset.yaml is missing or invalid")
	}
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Args, []string{"run"}) || len(c.Command) != 0 {
		t.Errorf("command %q args %q, want the image's entrypoint with args [run]", c.Command, c.Args)
	}

	env := map[string]*string{}
	envVar := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := envVar[e.Name]; dup {
			t.Errorf("env %s is set twice", e.Name)
		}
		envVar[e.Name] = e
		if e.ValueFrom == nil {
			env[e.Name] = &e.Value
		} else {
			env[e.Name] = nil
		}
	}
	validateEnv(t, "the DaemonSet", env)
	if f := envVar["PLEG_NODE_NAME"].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("PLEG_NODE_NAME is not the downward API's spec.nodeName: %+v", f)
	}
	if f := envVar["PLEG_NATS_URL"].ValueFrom; f == nil || f.SecretKeyRef == nil || f.SecretKeyRef.Name != "pleg-bridge-nats" ||
		f.SecretKeyRef.Key != "url" || f.SecretKeyRef.Optional == nil || *f.SecretKeyRef.Optional {
		t.Errorf("PLEG_NATS_URL is not the url key of the required secret pleg-bridge-nats: %+v", f)
	}

	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.Name] = vm
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		if _, ok := mounts[v.Name]; !ok {
			t.Errorf("volume %s is not mounted", v.Name)
		}
	}
	// volumeAt returns the mount and volume holding path.
	volumeAt := func(path string) (corev1.VolumeMount, corev1.Volume, bool) {
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == path || strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") {
				return vm, volumes[vm.Name], true
			}
		}
		return corev1.VolumeMount{}, corev1.Volume{}, false
	}

	sock, err := cri.ParseEndpoint(*env["PLEG_CRI_ENDPOINT"])
	if err != nil {
		t.Fatal(err)
	}
	vm, v, ok := volumeAt(sock)
	switch {
	case !ok:
		t.Errorf("no volume holds the CRI socket %s", sock)
	case v.HostPath == nil || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathSocket || v.HostPath.Path != sock:
		t.Errorf("the CRI socket is not the node's socket %s by a hostPath of type Socket: %+v", sock, v.VolumeSource)
	case !vm.ReadOnly || vm.MountPath != sock:
		t.Errorf("the CRI socket mount %+v is not the socket alone, read-only", vm)
	}

	creds := *env["PLEG_NATS_CREDS"]
	vm, v, ok = volumeAt(creds)
	if !ok || v.Secret == nil || v.Secret.SecretName != "pleg-bridge-nats" || !vm.ReadOnly ||
		v.Secret.Optional == nil || *v.Secret.Optional {
		t.Errorf("PLEG_NATS_CREDS=%s is not a file of the required secret pleg-bridge-nats, read-only: %+v %+v", creds, vm, v.VolumeSource)
	} else if rel, _ := filepath.Rel(vm.MountPath, creds); !slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool {
		return k.Key == "nats.creds" && k.Path == rel
	}) {
		t.Errorf("the secret volume does not put the key nats.creds at %s: %+v", creds, v.Secret.Items)
	}

	data := *env["PLEG_DATA_DIR"]
	vm, v, ok = volumeAt(data)
	if !ok || vm.ReadOnly || v.HostPath == nil || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("PLEG_DATA_DIR=%s is not a writable hostPath (DirectoryOrCreate), so the checkpoint would not survive a restart: %+v %+v", data, vm, v.VolumeSource)
	}

	// Probes on the metrics port, which is PLEG_LISTEN_ADDRESS's.
	port := listenPort(t, *env["PLEG_LISTEN_ADDRESS"])
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" })
	if i < 0 || port != strconv.Itoa(int(c.Ports[i].ContainerPort)) {
		t.Fatalf("no container port named metrics on PLEG_LISTEN_ADDRESS's port %s: %+v", port, c.Ports)
	}
	probe := func(name string, p *corev1.Probe, path string) {
		t.Helper()
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path ||
			(p.HTTPGet.Port.StrVal != "metrics" && p.HTTPGet.Port.IntVal != c.Ports[i].ContainerPort) {
			t.Errorf("%s probe is not GET %s on the metrics port: %+v", name, path, p)
		}
	}
	probe("liveness", c.LivenessProbe, "/healthz")
	probe("readiness", c.ReadinessProbe, "/readyz")
	if c.StartupProbe != nil {
		probe("startup", c.StartupProbe, "/healthz")
	}
	// A frozen bridge costs containerd memory until it is replaced: every
	// 5 s, 3 failures of 2 s, and the probe's own 5 s grace for the kill
	// (a stopped process cannot handle SIGTERM).
	if p := c.LivenessProbe; p != nil && (p.PeriodSeconds != 5 || p.TimeoutSeconds != 2 || p.FailureThreshold != 3 || p.InitialDelaySeconds != 10 ||
		p.TerminationGracePeriodSeconds == nil || *p.TerminationGracePeriodSeconds != 5) {
		t.Errorf("liveness probe timing %+v, want every 5s, 2s timeout, 3 failures, 10s initial delay, 5s grace", p)
	}

	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("the container has no securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the root filesystem is writable")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("privilege escalation is allowed")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0:
		t.Errorf("capabilities %+v, want all dropped and none added", sc.Capabilities)
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("the container is privileged")
	case sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsNonRoot == nil || *sc.RunAsNonRoot:
		t.Error("want runAsUser 0 with runAsNonRoot false stated, for the root-owned CRI socket")
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && pod.SecurityContext != nil {
		seccomp = pod.SecurityContext.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccomp profile %+v, want RuntimeDefault", seccomp)
	}

	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the pod automounts a service account token")
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("the pod shares a host namespace")
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", pod.PriorityClassName)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Errorf("tolerations %+v do not tolerate every taint", pod.Tolerations)
	}
	shutdown := defaultConfig().ShutdownTimeout
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v is not longer than PLEG_SHUTDOWN_TIMEOUT %s", g, shutdown)
	}
	if s := ds.Spec.UpdateStrategy; s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil ||
		s.RollingUpdate.MaxUnavailable == nil || s.RollingUpdate.MaxUnavailable.String() != "10%" {
		t.Errorf("update strategy %+v, want RollingUpdate with maxUnavailable 10%%", s)
	}

	res := c.Resources
	for _, q := range []struct {
		name string
		got  resource.Quantity
		want string
	}{
		{"requests.cpu", res.Requests[corev1.ResourceCPU], "20m"},
		{"requests.memory", res.Requests[corev1.ResourceMemory], "48Mi"},
		{"limits.memory", res.Limits[corev1.ResourceMemory], "192Mi"},
	} {
		if q.got.Cmp(resource.MustParse(q.want)) != 0 {
			t.Errorf("%s = %s, want %s", q.name, q.got.String(), q.want)
		}
	}
	if _, ok := res.Limits[corev1.ResourceCPU]; ok {
		t.Error("a CPU limit would throttle relists")
	}

	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("the selector %s does not match the pod labels %v", sel, ds.Spec.Template.Labels)
	}
	// The PodMonitor is an optional component now: kustomize_test.go checks it.
}

// --- deploy/nats ---

func TestNATSHelmValuesRunAJetStreamClusterWithTheAccounts(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Config struct {
			Cluster struct {
				Enabled  bool `json:"enabled"`
				Replicas int  `json:"replicas"`
			} `json:"cluster"`
			JetStream struct {
				Enabled   bool `json:"enabled"`
				FileStore struct {
					Enabled *bool `json:"enabled"`
					PVC     struct {
						Enabled *bool  `json:"enabled"`
						Size    string `json:"size"`
					} `json:"pvc"`
				} `json:"fileStore"`
			} `json:"jetstream"`
			Monitor struct {
				Enabled bool `json:"enabled"`
				Port    int  `json:"port"`
			} `json:"monitor"`
			Merge map[string]any `json:"merge"`
		} `json:"config"`
		Container struct {
			Env map[string]any `json:"env"`
		} `json:"container"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	c := v.Config
	if !c.Cluster.Enabled || c.Cluster.Replicas != 3 {
		t.Errorf("cluster %+v, want 3 servers", c.Cluster)
	}
	if !c.JetStream.Enabled || (c.JetStream.FileStore.Enabled != nil && !*c.JetStream.FileStore.Enabled) ||
		(c.JetStream.FileStore.PVC.Enabled != nil && !*c.JetStream.FileStore.PVC.Enabled) || c.JetStream.FileStore.PVC.Size == "" {
		t.Errorf("jetstream %+v, want a file store on a PVC", c.JetStream)
	} else if _, err := resource.ParseQuantity(c.JetStream.FileStore.PVC.Size); err != nil {
		t.Errorf("PVC size: %v", err)
	}
	if !c.Monitor.Enabled {
		t.Error("monitoring is off")
	}
	included := false
	for k, val := range c.Merge {
		included = included || strings.HasSuffix(k, "$include") && val == "accounts.conf"
	}
	if !included {
		t.Errorf("config.merge %v does not include accounts.conf", c.Merge)
	}
	accounts, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"PLEG_BRIDGE_NKEY", "PLEG_READER_NKEY"} {
		if !bytes.Contains(accounts, []byte("$"+name)) {
			t.Errorf("accounts.conf does not use $%s", name)
		}
		if _, ok := v.Container.Env[name]; !ok {
			t.Errorf("container.env does not provide %s, which accounts.conf needs", name)
		}
	}
}

// natsUsers are fresh NKeys for the users of accounts.conf, given to the
// configuration through the environment as values.yaml does.
type natsUsers struct{ bridge, reader nkeys.KeyPair }

func newNATSUsers(t *testing.T) natsUsers {
	t.Helper()
	var u natsUsers
	for _, kp := range []*nkeys.KeyPair{&u.bridge, &u.reader} {
		k, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		*kp = k
	}
	pub := func(k nkeys.KeyPair) string {
		p, err := k.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("PLEG_BRIDGE_NKEY", pub(u.bridge))
	t.Setenv("PLEG_READER_NKEY", pub(u.reader))
	return u
}

func TestNATSBridgeUserMayPublishOnlyEventsAndItsJetStreamCalls(t *testing.T) {
	u := newNATSUsers(t)
	m, err := conf.ParseFile(filepath.Join(repoRoot(t), "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatalf("accounts.conf: %v", err)
	}
	acc, _ := m["accounts"].(map[string]any)["PLEG"].(map[string]any)
	if acc == nil {
		t.Fatal("accounts.conf has no account PLEG")
	}
	if js := acc["jetstream"]; js != "enabled" && js != true {
		t.Errorf("account PLEG has jetstream %v", js)
	}
	bridgePub, _ := u.bridge.PublicKey()
	var perms map[string]any
	users, _ := acc["users"].([]any)
	for _, x := range users {
		if user, _ := x.(map[string]any); user["nkey"] == bridgePub {
			perms, _ = user["permissions"].(map[string]any)
		}
	}
	if perms == nil {
		t.Fatal("accounts.conf has no bridge user with permissions")
	}
	list := func(kind, verb string) []string {
		k, _ := perms[kind].(map[string]any)
		var out []string
		for _, s := range anySlice(k[verb]) {
			out = append(out, s.(string))
		}
		return out
	}
	pub := list("publish", "allow")
	if !slices.Contains(pub, "pleg.>") {
		t.Errorf("the bridge may not publish on pleg.>: %q", pub)
	}
	if !slices.Contains(pub, "$KV.PLEG_STATE.>") {
		t.Errorf("the bridge may not write the state bucket: %q", pub)
	}
	for _, s := range pub {
		if s != "pleg.>" && s != "$KV.PLEG_STATE.>" && !strings.HasPrefix(s, "$JS.API.") && !strings.HasPrefix(s, "$JS.FC.KV_PLEG_STATE.") && !strings.HasPrefix(s, "_INBOX.") {
			t.Errorf("the bridge may publish on %s, outside pleg.>, $KV.PLEG_STATE.>, $JS.API. and _INBOX.", s)
		}
		// Consumers to read back what its node stored: on the state
		// bucket, and on the stream with a filter (the reconcile after a
		// restart), never durable ones.
		if strings.HasPrefix(s, "$JS.API.CONSUMER.") && !strings.Contains(s, ".KV_PLEG_STATE") &&
			s != "$JS.API.CONSUMER.CREATE.PLEG.*.pleg.>" && s != "$JS.API.CONSUMER.MSG.NEXT.PLEG.*" && s != "$JS.API.CONSUMER.DELETE.PLEG.*" {
			t.Errorf("the bridge may publish on %s, a consumer call other than the reconcile's", s)
		}
		if s == "$JS.API.>" || strings.HasPrefix(s, "$JS.API.STREAM.DELETE") || strings.HasPrefix(s, "$JS.API.STREAM.PURGE") {
			t.Errorf("the bridge may publish on %s", s)
		}
	}
	// Its inboxes, and its stream's leader elections (the check that
	// what was acknowledged is still stored).
	if sub := list("subscribe", "allow"); !slices.Equal(sub, []string{"_INBOX.>", "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.PLEG"}) {
		t.Errorf("the bridge may subscribe to %q, want only its inboxes and its stream's leader elections", sub)
	}
}

func anySlice(v any) []any {
	switch v := v.(type) {
	case []any:
		return v
	case nil:
		return nil
	default:
		return []any{v}
	}
}

// TestNATSAccountsWorkForTheBridgeAndTheReader runs accounts.conf in a real
// server, included as the Helm chart includes it, and checks that the
// permissions are enough for what the bridge and a reader do and no more;
// and that the operator's stream.json is a stream the bridge accepts as is.
func TestNATSAccountsWorkForTheBridgeAndTheReader(t *testing.T) {
	u := newNATSUsers(t)
	connect := startAccountsServer(t)
	denied := func(who, subject string, nc *nats.Conn, errs chan error) {
		t.Helper()
		if err := nc.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("%s publishing on %s: %v, want a permissions violation", who, subject, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s may publish on %s", who, subject)
		}
	}

	// The operator creates the stream from stream.json (one replica on this
	// single server) and the bridge, managing it, accepts it unchanged.
	ncB, jsB, errsB := connect(u.bridge)
	cfg := readStreamJSON(t)
	cfg.Replicas = 1
	if _, err := jsB.CreateStream(t.Context(), cfg); err != nil {
		t.Fatalf("create the stream of stream.json as the bridge user: %v", err)
	}
	stream, err := publish.EnsureStream(t.Context(), jsB, publish.StreamOptions{
		Name: cfg.Name, SubjectPrefix: "pleg", Replicas: 1,
		MaxAge: defaultConfig().StreamMaxAge, DuplicateWindow: defaultConfig().StreamDuplicateWindow,
	})
	if err != nil {
		t.Fatalf("the bridge user cannot ensure the stream: %v", err)
	}
	if got := stream.CachedInfo().Config; got.MaxBytes != cfg.MaxBytes || got.MaxAge != cfg.MaxAge {
		t.Errorf("the bridge changed the operator's stream: %+v", got)
	}
	if _, err := jsB.AccountInfo(t.Context()); err != nil {
		t.Errorf("the bridge user cannot read its account info: %v", err)
	}
	event := schemas.Subject("pleg", "node-1", "shop", "6f1c2a7e", "ContainerStarted")
	ack, err := jsB.Publish(t.Context(), event, []byte(`{}`), jetstream.WithMsgID("e1"))
	if err != nil || ack.Stream != cfg.Name {
		t.Fatalf("the bridge user cannot publish an event: %v", err)
	}
	// What a restarted bridge reads back before it publishes
	// (publish/readback.go), and the check of a late retry (verify.go).
	streamB, err := jsB.Stream(t.Context(), cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := streamB.CreateConsumer(t.Context(), jetstream.ConsumerConfig{
		FilterSubject: "pleg.node-1.>", AckPolicy: jetstream.AckNonePolicy, HeadersOnly: true, MemoryStorage: true,
	})
	if err != nil {
		t.Fatalf("the bridge user cannot read back its node's events after a restart: %v", err)
	}
	if batch, err := rc.Fetch(1, jetstream.FetchMaxWait(10*time.Second)); err != nil {
		t.Errorf("the bridge user cannot fetch from its reconcile consumer: %v", err)
	} else if m, ok := <-batch.Messages(); !ok || m.Headers().Get(jetstream.MsgIDHeader) != "e1" {
		t.Errorf("the bridge user reads back %v (%v), want the event e1", m, batch.Error())
	}
	if err := streamB.DeleteConsumer(t.Context(), rc.CachedInfo().Name); err != nil {
		t.Errorf("the bridge user cannot delete its reconcile consumer: %v", err)
	}
	if m, err := streamB.GetLastMsgForSubject(t.Context(), event); err != nil || m.Sequence != ack.Sequence {
		t.Errorf("the bridge user cannot check the last message of a subject: %v", err)
	}
	denied("the bridge", "other.subject", ncB, errsB)
	denied("the bridge", "$JS.API.STREAM.DELETE."+cfg.Name, ncB, errsB)
	denied("the bridge", "$JS.API.CONSUMER.DURABLE.CREATE."+cfg.Name+".x", ncB, errsB)
	denied("the bridge", "$JS.API.CONSUMER.CREATE."+cfg.Name+".x", ncB, errsB)
	if _, err := ncB.SubscribeSync("pleg.>"); err != nil {
		t.Fatal(err)
	}
	if err := ncB.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errsB:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("the bridge subscribing to pleg.>: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the bridge may subscribe to pleg.>")
	}

	// A reader follows the stream as tail and replay do, and cannot publish.
	ncR, jsR, errsR := connect(u.reader)
	cons, err := jsR.OrderedConsumer(t.Context(), cfg.Name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("the reader cannot create a consumer: %v", err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil || msg.Subject() != event {
		t.Fatalf("the reader cannot read the event: %v", err)
	}
	denied("the reader", schemas.Subject("pleg", "node-1", "shop", "6f1c2a7e", "ContainerDied"), ncR, errsR)
}

// readStreamJSON decodes deploy/nats/stream.json strictly and checks it
// against the stream the bridge would create with its defaults.
func readStreamJSON(t *testing.T) jetstream.StreamConfig {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "stream.json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var cfg jetstream.StreamConfig
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("stream.json: %v", err)
	}
	def := defaultConfig()
	switch {
	case cfg.Name != def.Stream:
		t.Errorf("stream.json name %q, want PLEG_STREAM's default %q", cfg.Name, def.Stream)
	case !slices.Equal(cfg.Subjects, []string{def.SubjectPrefix + ".>"}):
		t.Errorf("stream.json subjects %q", cfg.Subjects)
	case cfg.Storage != jetstream.FileStorage || cfg.Retention != jetstream.LimitsPolicy:
		t.Errorf("stream.json storage %v retention %v, want file and limits", cfg.Storage, cfg.Retention)
	case cfg.Replicas != 3:
		t.Errorf("stream.json replicas %d, want 3", cfg.Replicas)
	case cfg.MaxAge != def.StreamMaxAge || cfg.Duplicates != def.StreamDuplicateWindow:
		t.Errorf("stream.json max age %s and duplicate window %s differ from the bridge's defaults, which would rewrite them",
			cfg.MaxAge, cfg.Duplicates)
	}
	return cfg
}

// startAccountsServer runs deploy/nats/accounts.conf in a real server,
// included as the Helm chart includes it, and returns how to connect to it
// as one of newNATSUsers' users: the connection, its JetStream handle, and
// the asynchronous errors (permission violations) the server sends it.
func startAccountsServer(t *testing.T) func(kp nkeys.KeyPair) (*nats.Conn, jetstream.JetStream, chan error) {
	t.Helper()
	accounts, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	_, connect := startAccountsServerWith(t, accounts)
	return connect
}

// startAccountsServerWith is startAccountsServer with accounts as the
// content of accounts.conf; it returns the server's URL too.
func startAccountsServerWith(t *testing.T, accounts []byte) (string, func(kp nkeys.KeyPair) (*nats.Conn, jetstream.JetStream, chan error)) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), accounts, 0o600); err != nil {
		t.Fatal(err)
	}
	mainConf := "listen: \"127.0.0.1:-1\"\njetstream { store_dir: \"" + filepath.ToSlash(filepath.Join(dir, "js")) + "\" }\ninclude accounts.conf\n"
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(mainConf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("the server refuses accounts.conf: %v", err)
	}
	s := publishtest.RunServer(t, opts)
	return s.ClientURL(), func(kp nkeys.KeyPair) (*nats.Conn, jetstream.JetStream, chan error) {
		t.Helper()
		pub, _ := kp.PublicKey()
		errs := make(chan error, 64)
		nc, err := nats.Connect(s.ClientURL(), nats.Nkey(pub, kp.Sign),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case errs <- err:
				default:
				}
			}))
		if err != nil {
			t.Fatalf("connect as %s: %v", pub, err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js, errs
	}
}

// uncommentUser returns accounts with the commented-out example user whose
// nkey is $nkeyVar made live: the lines from "# { nkey: $nkeyVar" to the
// next "# }", without their "# ".
func uncommentUser(t *testing.T, accounts []byte, nkeyVar string) []byte {
	t.Helper()
	lines := strings.SplitAfter(string(accounts), "\n")
	start := slices.IndexFunc(lines, func(l string) bool {
		return strings.HasPrefix(strings.TrimSpace(l), "# { nkey: $"+nkeyVar)
	})
	if start < 0 {
		t.Fatalf("accounts.conf has no commented-out user with nkey $%s", nkeyVar)
	}
	for i := start; i < len(lines); i++ {
		end := strings.TrimSpace(lines[i]) == "# }"
		lines[i] = strings.Replace(lines[i], "# ", "", 1)
		if end {
			return []byte(strings.Join(lines, ""))
		}
	}
	t.Fatalf("the example user $%s of accounts.conf does not end with # }", nkeyVar)
	return nil
}

// TestNATSAccountsNamespaceReaderExample runs accounts.conf with its
// example reader of the namespace shop made live: its permissions are
// natsauth.ReaderPermissions' for shop, and with them pleg-bridge replay
// and ps of shop work and those of payments, or of everything, are refused
// at once, naming the refused subject.
func TestNATSAccountsNamespaceReaderExample(t *testing.T) {
	u := newNATSUsers(t)
	shopKey, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	shopPub, _ := shopKey.PublicKey()
	t.Setenv("PLEG_READER_SHOP_NKEY", shopPub)
	const inbox = "_INBOX_reader-shop"
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	accounts := uncommentUser(t, b, "PLEG_READER_SHOP_NKEY")

	path := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(path, accounts, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := conf.ParseFile(path)
	if err != nil {
		t.Fatalf("accounts.conf with the shop reader: %v", err)
	}
	var perms map[string]any
	users, _ := m["accounts"].(map[string]any)["PLEG"].(map[string]any)["users"].([]any)
	for _, x := range users {
		if user, _ := x.(map[string]any); user["nkey"] == shopPub {
			perms, _ = user["permissions"].(map[string]any)
		}
	}
	list := func(kind string) []string {
		k, _ := perms[kind].(map[string]any)
		var out []string
		for _, s := range anySlice(k["allow"]) {
			out = append(out, s.(string))
		}
		slices.Sort(out)
		return out
	}
	want, err := natsauth.ReaderPermissions(natsauth.Names{}, []string{"shop"}, nil, inbox)
	if err != nil {
		t.Fatal(err)
	}
	wantPub, wantSub := slices.Sorted(slices.Values(want.Pub.Allow)), slices.Sorted(slices.Values(want.Sub.Allow))
	if pub, sub := list("publish"), list("subscribe"); !slices.Equal(pub, wantPub) || !slices.Equal(sub, wantSub) {
		t.Errorf("the shop reader of accounts.conf may\npub %q\nsub %q\nwant natsauth.ReaderPermissions'\npub %q\nsub %q", pub, sub, wantPub, wantSub)
	}

	// The bridge user sets up the stream and the bucket and publishes
	// events and state of shop and payments.
	url, connect := startAccountsServerWith(t, accounts)
	_, jsB, _ := connect(u.bridge)
	ctx := t.Context()
	cfg := readStreamJSON(t)
	cfg.Replicas = 1
	if _, err := jsB.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	kv, err := jsB.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: schemas.DefaultStateBucket})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := publish.NewEncoder(publish.EncoderOptions{Node: "node-1", SubjectPrefix: "pleg"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []generator.Pod{{UID: "u-web", Namespace: "shop", Name: "web-0"}, {UID: "u-pay", Namespace: "payments", Name: "pay-0"}} {
		at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
		msg, err := enc.Encode(generator.Event{
			Type: generator.ContainerStarted, Pod: p, State: generator.StateRunning, Time: at, ObservedAt: at,
			Container: generator.Container{ID: "c-" + p.UID, Name: "app", Image: "registry.example/app:1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := jsB.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		key := schemas.StateKey(schemas.StateRef{Node: "node-1", Namespace: p.Namespace, Pod: p.Name, PodUID: p.UID, ContainerID: "c-" + p.UID})
		if _, err := kv.Put(ctx, key, msg.Data); err != nil {
			t.Fatal(err)
		}
	}

	seed, err := shopKey.Seed()
	if err != nil {
		t.Fatal(err)
	}
	seedFile := filepath.Join(t.TempDir(), "reader-shop.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	reader := []string{"--nats-url", url, "--nkey", seedFile, "--inbox-prefix", inbox}
	for _, tt := range []struct {
		args        []string
		want, wantN string // in the output, or in the refusal
	}{
		{args: []string{"replay", "-n", "shop"}, want: "shop/web-0/app"},
		{args: []string{"ps", "-n", "shop"}, want: "web-0"},
		{args: []string{"replay", "-n", "payments"}, wantN: `.pleg.*.payments.>"`},
		{args: []string{"replay", "--node", "node-1"}, wantN: `.pleg.node-1.>"`},
		{args: []string{"ps"}, wantN: `.$KV.PLEG_STATE.>"`},
		{args: []string{"ps", "-n", "payments"}, wantN: `.$KV.PLEG_STATE.*.payments.>"`},
	} {
		var stdout, stderr bytes.Buffer
		err := run(ctx, append(tt.args, reader...), envFrom(t, nil), &stdout, &stderr)
		if strings.Contains(stdout.String(), "pay-0") || strings.Contains(stdout.String(), "payments") {
			t.Errorf("%s as the shop reader printed %q", strings.Join(tt.args, " "), stdout.String())
		}
		if tt.want != "" && (err != nil || !strings.Contains(stdout.String(), tt.want)) {
			t.Errorf("%s as the shop reader: %v, printed %q, want %s (stderr %s)", strings.Join(tt.args, " "), err, stdout.String(), tt.want, stderr.String())
		}
		if tt.wantN != "" && (err == nil || !strings.Contains(err.Error(), "$JS.API.CONSUMER.CREATE.") || !strings.Contains(err.Error(), tt.wantN)) {
			t.Errorf("%s as the shop reader = %v, want a refusal naming %s", strings.Join(tt.args, " "), err, tt.wantN)
		}
	}
}
