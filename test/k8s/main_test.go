//go:build k8s

package k8s

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The environment cluster.sh writes (<workdir>/env) and run.sh adds to.
const (
	envKubectl = "PLEG_K8S_KUBECTL"           // kubectl built with the cluster
	envCtr     = "PLEG_K8S_CTR"               // ctr of the node's containerd
	envNode    = "PLEG_K8S_NODE"              // the node's name
	envNodeIP  = "PLEG_K8S_NODE_IP"           // its InternalIP, where the host's NATS listens
	envSocket  = "PLEG_K8S_CONTAINERD_SOCKET" // the node's CRI socket
	envImage   = "PLEG_K8S_IMAGE"             // the pleg-bridge image, imported into containerd
	envHelm    = "PLEG_K8S_HELM"              // helm
	// The upgrade tests' other builds, imported too, and the chart of the
	// old one's commit.
	envImageB    = "PLEG_K8S_IMAGE_B"    // the same source as the image, stamped with another version
	envImageOld  = "PLEG_K8S_IMAGE_OLD"  // a build of the previous data directory's format
	envOldChart  = "PLEG_K8S_OLD_CHART"  // that commit's deploy/helm/pleg-bridge
	envOldCommit = "PLEG_K8S_OLD_COMMIT" // that commit
)

// suite is what every test shares: set once by TestMain, read-only after.
var suite struct {
	repo       string
	kubeconfig string
	kubectl    string
	ctr        string
	helm       string
	node       string
	nodeIP     string
	socket     string
	image      string // repository:tag
	imageB     string // repository:tag
	imageOld   string // repository:tag
	oldChart   string
	oldCommit  string
}

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		// Never a skip: run.sh started a cluster for these tests.
		fmt.Fprintln(os.Stderr, "k8s tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func setup() error {
	var missing []string
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			missing = append(missing, name)
		}
		return v
	}
	suite.kubeconfig = get("KUBECONFIG")
	suite.kubectl = get(envKubectl)
	suite.ctr = get(envCtr)
	suite.helm = get(envHelm)
	suite.node = get(envNode)
	suite.nodeIP = get(envNodeIP)
	suite.socket = get(envSocket)
	suite.image = get(envImage)
	suite.imageB = get(envImageB)
	suite.imageOld = get(envImageOld)
	suite.oldChart = get(envOldChart)
	suite.oldCommit = get(envOldCommit)
	if len(missing) > 0 {
		return fmt.Errorf("%s not set: run the tests with bash test/k8s/run.sh, which starts the cluster", strings.Join(missing, ", "))
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return err
	}
	suite.repo = root
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return fmt.Errorf("repository root not found at %s: %w", root, err)
	}
	return nil
}

// commandTimeout bounds every command the tests run.
const commandTimeout = 3 * time.Minute

// run runs a command with stdin and returns its standard output, or an
// error with its standard error. It does not use the test's context, so
// that cleanups can run it too.
func run(stdin []byte, name string, args ...string) ([]byte, error) {
	stdout, _, err := runOutput(stdin, name, args...)
	return stdout, err
}

// runOutput is run that also returns the standard error of a command that
// succeeded: what kubectl prints there are warnings.
func runOutput(stdin []byte, name string, args ...string) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+suite.kubeconfig)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.Bytes(), errOut.Bytes(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, errOut.String())
	}
	return out.Bytes(), errOut.Bytes(), nil
}

// kubectlQuiet runs kubectl like kubectl, and fails the test if it prints
// anything on its standard error: a warning (Pod Security, a missing
// last-applied-configuration, a deprecated API) that a user following the
// documentation would see.
func kubectlQuiet(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	out, stderr, err := runOutput(stdin, suite.kubectl, args...)
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.TrimSpace(string(stderr)); s != "" {
		t.Errorf("kubectl %s printed on its standard error:\n%s", strings.Join(args, " "), s)
	}
	return out
}

// kubectl runs kubectl and fails the test if it fails.
func kubectl(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	out, err := run(stdin, suite.kubectl, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
