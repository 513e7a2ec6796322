//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pleg-bridge/pleg-bridge/internal/waittest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criTimeout bounds every CRI call the tests make.
const criTimeout = 30 * time.Second

// podNamespace is the namespace of every test pod.
const podNamespace = "e2e"

// cri drives pods through the runtime as a kubelet would. It never opens
// GetContainerEvents: on containerd 1.7 a second subscriber would steal the
// bridge's events.
type cri struct {
	t      *testing.T
	conn   *grpc.ClientConn
	rt     runtimeapi.RuntimeServiceClient
	prefix string // pod UID prefix, unique to the test
	mu     sync.Mutex
	pods   []string // guarded by mu: sandbox IDs created, for cleanup
}

// newCRI connects to the suite's containerd. Pods it creates have UIDs
// starting with a prefix unique to the test, and are removed at cleanup
// if the test did not remove them.
func newCRI(t *testing.T) *cri {
	t.Helper()
	c := &cri{t: t, prefix: "e2e-" + randomToken() + "-"}
	c.reconnect()
	t.Cleanup(func() {
		c.removeAll()
		c.conn.Close()
	})
	return c
}

// reconnect replaces the client's connection with a new one, as after a
// runtime restart: gRPC's own reconnect backoff could otherwise delay the
// next call by up to two minutes.
func (c *cri) reconnect() {
	c.t.Helper()
	conn, err := grpc.NewClient("unix://"+suite.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	if c.conn != nil {
		c.conn.Close()
	}
	c.conn, c.rt = conn, runtimeapi.NewRuntimeServiceClient(conn)
}

func randomToken() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *cri) ctx() (context.Context, context.CancelFunc) {
	// Calls wait for the connection, so that they work right after a
	// runtime restart; the deadline bounds the wait.
	return context.WithTimeout(c.t.Context(), criTimeout)
}

var waitForReady = grpc.WaitForReady(true)

// pod is a running pod sandbox.
type pod struct {
	id     string
	uid    string
	name   string
	config *runtimeapi.PodSandboxConfig
}

// runPod starts a pod sandbox with the host's network (no CNI here) and an
// empty hostname, as host-network pods need.
func (c *cri) runPod(name string) pod {
	c.t.Helper()
	p, err := c.tryRunPod(name)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// tryRunPod is runPod for other goroutines than the test's.
func (c *cri) tryRunPod(name string) (pod, error) {
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Uid: c.prefix + name, Namespace: podNamespace},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			},
		},
	}
	ctx, cancel := c.ctx()
	defer cancel()
	resp, err := c.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg}, waitForReady)
	if err != nil {
		return pod{}, fmt.Errorf("RunPodSandbox %s: %w", name, err)
	}
	c.mu.Lock()
	c.pods = append(c.pods, resp.PodSandboxId)
	c.mu.Unlock()
	return pod{id: resp.PodSandboxId, uid: cfg.Metadata.Uid, name: name, config: cfg}, nil
}

// startWork creates and starts a container of the work image that sleeps
// for d and exits with code exit, and returns its ID.
func (c *cri) startWork(p pod, name string, d time.Duration, exit int) string {
	c.t.Helper()
	id, err := c.tryStartWork(p, name, d, exit)
	if err != nil {
		c.t.Fatal(err)
	}
	return id
}

// tryStartWork is startWork for other goroutines than the test's.
func (c *cri) tryStartWork(p pod, name string, d time.Duration, exit int) (string, error) {
	id, err := c.tryCreateWork(p, name, d, exit)
	if err != nil {
		return "", err
	}
	ctx, cancel := c.ctx()
	defer cancel()
	if _, err := c.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}, waitForReady); err != nil {
		return "", fmt.Errorf("StartContainer %s/%s: %w", p.name, name, err)
	}
	return id, nil
}

func (c *cri) tryCreateWork(p pod, name string, d time.Duration, exit int) (string, error) {
	return c.tryCreate(p, name, nil, "work", "--sleep", d.String(), "--exit", fmt.Sprint(exit))
}

// tryStart creates and starts a container of the work image running
// /pleg-e2e with args, with resources if not nil, and returns its ID.
func (c *cri) tryStart(p pod, name string, resources *runtimeapi.LinuxContainerResources, args ...string) (string, error) {
	id, err := c.tryCreate(p, name, resources, args...)
	if err != nil {
		return "", err
	}
	ctx, cancel := c.ctx()
	defer cancel()
	if _, err := c.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}, waitForReady); err != nil {
		return "", fmt.Errorf("StartContainer %s/%s: %w", p.name, name, err)
	}
	return id, nil
}

func (c *cri) tryCreate(p pod, name string, resources *runtimeapi.LinuxContainerResources, args ...string) (string, error) {
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: workImage},
		Command:  append([]string{"/pleg-e2e"}, args...),
	}
	if resources != nil {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: resources}
	}
	ctx, cancel := c.ctx()
	defer cancel()
	resp, err := c.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config,
	}, waitForReady)
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s/%s: %w", p.name, name, err)
	}
	return resp.ContainerId, nil
}

// stop stops a container; timeout 0 means SIGKILL at once.
func (c *cri) stop(id string, timeout int64) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if _, err := c.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: timeout}, waitForReady); err != nil {
		c.t.Fatalf("StopContainer %s: %v", id, err)
	}
}

func (c *cri) remove(id string) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if _, err := c.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}, waitForReady); err != nil {
		c.t.Fatalf("RemoveContainer %s: %v", id, err)
	}
}

func (c *cri) stopPod(p pod) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if _, err := c.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.id}, waitForReady); err != nil {
		c.t.Fatalf("StopPodSandbox %s: %v", p.name, err)
	}
}

func (c *cri) removePod(p pod) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if _, err := c.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.id}, waitForReady); err != nil {
		c.t.Fatalf("RemovePodSandbox %s: %v", p.name, err)
	}
}

// exitedStatus returns the container's status once the runtime reports it
// exited: a bridge may report an exit before CRI shows it (from
// containerd's task exit), and CRI's view is what the tests compare with.
func (c *cri) exitedStatus(id string) *runtimeapi.ContainerStatus {
	c.t.Helper()
	var st *runtimeapi.ContainerStatus
	waittest.Until(c.t, eventTimeout, fmt.Sprintf("CRI to show container %s exited, as the bridge reported", id), func() (bool, error) {
		st = c.status(id)
		return st.State == runtimeapi.ContainerState_CONTAINER_EXITED, fmt.Errorf("it is %v", st.State)
	})
	return st
}

// status returns the container's status as the runtime reports it.
func (c *cri) status(id string) *runtimeapi.ContainerStatus {
	c.t.Helper()
	return c.statusResponse(id, false).Status
}

func (c *cri) statusResponse(id string, verbose bool) *runtimeapi.ContainerStatusResponse {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	resp, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose}, waitForReady)
	if err != nil {
		c.t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	return resp
}

// pid returns the host PID of a running container's process, from the
// verbose status.
func (c *cri) pid(id string) int {
	c.t.Helper()
	resp := c.statusResponse(id, true)
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil || info.Pid <= 0 {
		c.t.Fatalf("no pid in the verbose status of %s (%v): %.200s", id, err, resp.Info["info"])
	}
	return info.Pid
}

// removeAll stops and removes the test's pods that are left, with their
// containers. Errors are logged only: the pod may be gone already.
func (c *cri) removeAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*criTimeout)
	defer cancel()
	c.mu.Lock()
	pods := c.pods
	c.mu.Unlock()
	for _, id := range pods {
		if _, err := c.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil && !strings.Contains(err.Error(), "not found") {
			c.t.Logf("cleanup: StopPodSandbox %s: %v", id, err)
		}
		if _, err := c.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil && !strings.Contains(err.Error(), "not found") {
			c.t.Logf("cleanup: RemovePodSandbox %s: %v", id, err)
		}
	}
}

// waitProcessExit blocks until the process pid has exited, or fails the
// test after d. It waits on a pidfd, which becomes readable when the
// process exits: this works while containerd is down, when the CRI has
// nothing to report.
func waitProcessExit(t *testing.T, pid int, d time.Duration) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if err == unix.ESRCH {
			return // gone already
		}
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for {
		n, err := unix.Poll(fds, int(time.Until(deadline).Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("poll pidfd of %d: %v", pid, err)
		}
		if n == 1 {
			return
		}
		t.Fatalf("process %d still runs after %v", pid, d)
	}
}

// tryTeardown removes the containers ids of pod p, then stops and removes
// the pod, as a kubelet does; for other goroutines than the test's.
func (c *cri) tryTeardown(p pod, ids ...string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	for _, id := range ids {
		if _, err := c.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}, waitForReady); err != nil {
			return fmt.Errorf("RemoveContainer %s in %s: %w", id, p.name, err)
		}
	}
	if _, err := c.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.id}, waitForReady); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", p.name, err)
	}
	if _, err := c.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.id}, waitForReady); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", p.name, err)
	}
	return nil
}
