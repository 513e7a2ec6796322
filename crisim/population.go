package crisim

import (
	"fmt"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// lastAppliedEvery is how often a populated pod carries kubectl's
// last-applied-configuration annotation: one pod in four, as on a node where
// some workloads were created with kubectl apply and the rest by
// controllers.
const lastAppliedEvery = 4

// PopulateKubelet adds pods running sandboxes and containers running
// containers in all, spread as evenly as the counts allow, without emitting
// any event. Unlike Populate, every object carries what the kubelet puts on
// what it creates, so that what a relist reads is as large as on a real
// node: sandboxes with workload labels, the kubelet's config annotations
// and, on one pod in four, a last-applied-configuration of a few KB;
// containers with the kubelet's labels and its annotations (container hash,
// restart count, termination message path and policy, ports,
// termination grace period). A container lists at about 1 KB.
func (r *Runtime) PopulateKubelet(pods, containers int) error {
	if pods <= 0 || containers < 0 {
		return fmt.Errorf("populate: %d pods and %d containers: want at least one pod", pods, containers)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now().UnixNano()
	for p := range pods {
		r.populated++
		n := r.populated
		app := fmt.Sprintf("app-%d", n%50)
		hash := fmt.Sprintf("%08x", uint32(n)*2654435761)[:8]
		name := fmt.Sprintf("%s-%s-%05d", app, hash[:5], n)
		ns := fmt.Sprintf("team-%d", n%7)
		labels := map[string]string{
			"app":                          app,
			"app.kubernetes.io/name":       app,
			"app.kubernetes.io/instance":   app + "-prod",
			"app.kubernetes.io/component":  "server",
			"app.kubernetes.io/managed-by": "Helm",
			"pod-template-hash":            hash,
		}
		annotations := map[string]string{
			"kubernetes.io/config.seen":   time.Unix(0, now).UTC().Format(time.RFC3339Nano),
			"kubernetes.io/config.source": "api",
			"prometheus.io/scrape":        "true",
			"prometheus.io/port":          "9090",
		}
		if n%lastAppliedEvery == 0 {
			annotations["kubectl.kubernetes.io/last-applied-configuration"] = lastApplied(ns, name, app)
		}
		sb, err := r.addSandboxLocked(PodConfig{Name: name, Namespace: ns, Labels: labels, Annotations: annotations}, now)
		if err != nil {
			return fmt.Errorf("populate: %w", err)
		}
		// Pod p gets the containers left over from an even split first.
		count := containers / pods
		if p < containers%pods {
			count++
		}
		for i := range count {
			cname := containerName(i)
			c, err := r.addContainerLocked(sb.sb.Id, ContainerConfig{
				Name:        cname,
				Image:       fmt.Sprintf("registry.example/%s/%s:1.%d.%d", ns, cname, n%10, i),
				Annotations: kubeletContainerAnnotations(n, i),
			}, now)
			if err != nil {
				return fmt.Errorf("populate: %w", err)
			}
			// Nobody has seen this record yet: change it in place, as
			// Populate does.
			c.ctr.State = runtimeapi.ContainerState_CONTAINER_RUNNING
			c.status.State = runtimeapi.ContainerState_CONTAINER_RUNNING
			c.status.StartedAt = now
		}
	}
	return nil
}

// kubeletContainerAnnotations are the annotations the kubelet puts on
// container i of pod n.
func kubeletContainerAnnotations(n, i int) map[string]string {
	return map[string]string{
		"io.kubernetes.container.hash":                     fmt.Sprintf("%08x", uint32(n*31+i)*2246822519),
		"io.kubernetes.container.restartCount":             fmt.Sprint((n + i) % 3),
		"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
		"io.kubernetes.container.terminationMessagePolicy": "File",
		"io.kubernetes.pod.terminationGracePeriod":         "30",
		"io.kubernetes.container.ports": fmt.Sprintf(
			`[{"name":"http","containerPort":%d,"protocol":"TCP"},{"name":"metrics","containerPort":9090,"protocol":"TCP"}]`, 8080+i),
	}
}

// lastApplied is a kubectl last-applied-configuration for a Deployment's
// pod: the whole object as JSON, about 3 KB.
func lastApplied(ns, name, app string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"annotations":{},"labels":{"app":%q,"app.kubernetes.io/name":%q},"name":%q,"namespace":%q},`, app, app, name, ns)
	fmt.Fprintf(&b, `"spec":{"replicas":3,"selector":{"matchLabels":{"app":%q}},"template":{"metadata":{"labels":{"app":%q}},"spec":{"containers":[`, app, app)
	for i := range 3 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"c%d","image":"registry.example/%s/c%d:1.0.%d","args":["--config=/etc/%s/config.yaml","--log-level=info","--listen=:%d"],`, i, ns, i, i, app, 8080+i)
		fmt.Fprintf(&b, `"env":[{"name":"POD_NAME","valueFrom":{"fieldRef":{"fieldPath":"metadata.name"}}},{"name":"POD_NAMESPACE","valueFrom":{"fieldRef":{"fieldPath":"metadata.namespace"}}},{"name":"GOMAXPROCS","value":"2"}],`)
		fmt.Fprintf(&b, `"ports":[{"containerPort":%d,"name":"http","protocol":"TCP"}],"readinessProbe":{"httpGet":{"path":"/readyz","port":"http"},"periodSeconds":10},"livenessProbe":{"httpGet":{"path":"/healthz","port":"http"},"periodSeconds":10,"failureThreshold":3},`, 8080+i)
		fmt.Fprintf(&b, `"resources":{"limits":{"memory":"256Mi"},"requests":{"cpu":"100m","memory":"128Mi"}},"volumeMounts":[{"mountPath":"/etc/%s","name":"config","readOnly":true}]}`, app)
	}
	fmt.Fprintf(&b, `],"volumes":[{"configMap":{"name":"%s-config"},"name":"config"}],"securityContext":{"runAsNonRoot":true,"runAsUser":65532}}}}}`, app)
	return b.String()
}
