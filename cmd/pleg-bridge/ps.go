package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// psColumns are the columns of ps's table, as crictl ps and kubectl name
// theirs. RESTARTS is the container's attempt number, which the kubelet
// raises at each restart in the same sandbox, as kubectl's RESTARTS.
var psColumns = []string{"NODE", "NAMESPACE", "POD", "CONTAINER", "STATE", "EXIT", "RESTARTS", "AGE"}

// psFlags are ps's flags.
type psFlags struct {
	nats      *natsFlags
	bucket    string
	node      string
	namespace string
	pod       string
	selector  string
	failed    bool
	labels    consumer.Selector // parsed --selector
	all       bool
	sandboxes bool
	watch     bool
	json      bool
}

// newPSCommand is the ps subcommand: a cluster-wide crictl ps from the
// bridges' state bucket.
func newPSCommand(env commandEnv) *cobra.Command { return psCommand(env, time.Now) }

// psCommand is newPSCommand with the clock the AGE column is computed with.
func psCommand(env commandEnv, now func() time.Time) *cobra.Command {
	f := &psFlags{}
	c := &cobra.Command{
		Use:   "ps",
		Short: "List the current containers of the cluster, a node, a namespace or a pod, from NATS",
		Long: `The list is read from the bridges' state bucket (PLEG_STATE_BUCKET), which
holds every container's latest event: no Kubernetes API and no replay of the
stream. Running containers by default, like crictl ps; --all adds exited
ones with their exit code. --watch goes on printing a row for each change
until Ctrl-C.`,
		Example: `  pleg-bridge ps                                # running containers of the cluster
  pleg-bridge ps --node node-1 --all            # also exited ones, with exit code and reason
  pleg-bridge ps --namespace shop
  pleg-bridge ps -n shop -l app=web --failed    # containers of app=web pods whose last exit failed
  pleg-bridge ps --pod shop/web-0 --watch       # the list, then one row per change
  pleg-bridge ps --json | jq .event.data.exitCode`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runPS(c.Context(), c.CommandPath(), f, env.stdout, env.stderr, now)
		},
	}
	fl := c.Flags()
	f.nats = addNATSFlags(fl, env.getenv)
	fl.StringVar(&f.bucket, "bucket", cmp.Or(env.getenv("PLEG_STATE_BUCKET"), schemas.DefaultStateBucket), "the bridges' state bucket (env PLEG_STATE_BUCKET)")
	fl.StringVar(&f.node, "node", "", "only containers of this node")
	fl.StringVarP(&f.namespace, "namespace", "n", "", "only containers of this namespace")
	fl.StringVar(&f.pod, "pod", "", "only containers of this pod: namespace/name or pod UID")
	fl.StringVarP(&f.selector, "selector", "l", "", "only containers of pods whose labels match this Kubernetes label selector: app=web, tier!=db, 'env in (prod,stage)', !canary")
	fl.BoolVar(&f.failed, "failed", false, "only containers whose last exit was a failure: a non-zero exit code or a reason such as OOMKilled (implies --all)")
	fl.BoolVarP(&f.all, "all", "a", false, "show exited containers too, not only running ones")
	fl.BoolVar(&f.sandboxes, "sandboxes", false, "show pod sandboxes too")
	fl.BoolVarP(&f.watch, "watch", "w", false, "after the list, print each change until interrupted")
	fl.BoolVar(&f.json, "json", false, "print one JSON object a line: key, op and the container's latest CloudEvent")
	registerStateCompletions(c, stateFlags{nats: f.nats, bucket: &f.bucket, node: &f.node, namespace: &f.namespace, pod: &f.pod})
	return c
}

// runPS prints the current containers that f selects as a table (or JSON
// lines), and with --watch goes on printing each change until ctx is done,
// then returns nil.
func runPS(ctx context.Context, cmd string, f *psFlags, stdout, stderr io.Writer, now func() time.Time) error {
	filter, err := f.filter()
	if err != nil {
		return &cli.UsageError{Cmd: cmd, Err: err}
	}
	ctx, nc, js, err := f.nats.connect(ctx, "pleg-bridge ps")
	if err != nil {
		return err
	}
	defer nc.Close()
	p := &psPrinter{f: f, w: stdout, now: now}
	opts := consumer.StateOptions{
		Bucket: f.bucket, Filter: filter,
		OnError: func(err error) { fmt.Fprintf(stderr, "skip entry: %v\n", err) },
	}
	var listed []consumer.ContainerState
	err = consumer.WatchState(ctx, js, opts, func(ch consumer.StateChange) error {
		switch ch.Op {
		case consumer.StateListed:
			listed = append(listed, ch.Container)
			return nil
		case consumer.StateSynced:
			if err := p.list(listed); err != nil {
				return err
			}
			if p.shown == 0 && f.describe() != "" {
				fmt.Fprintf(stderr, "no %s containers match %s\n", p.which(), f.describe())
			}
			if !f.watch {
				return errListDone
			}
			return nil
		default:
			return p.change(ch)
		}
	})
	if err := refusal(ctx); err != nil {
		return err
	}
	switch {
	case errors.Is(err, errListDone):
		return nil
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("state bucket %s not found (--bucket): the bridges keep it when PLEG_STATE_BUCKET is set", f.bucket)
	}
	// ps --json | head: the reader has what it wanted.
	return endOfOutput(err)
}

// errListDone ends the watch of a ps without --watch.
var errListDone = errors.New("listed")

// filter returns the state filter of the flags: --pod is namespace/name,
// or a pod UID.
func (f *psFlags) filter() (consumer.StateFilter, error) {
	filter := consumer.StateFilter{Node: f.node, Namespace: f.namespace}
	var err error
	if f.labels, err = consumer.ParseSelector(f.selector); err != nil {
		return filter, fmt.Errorf("--selector: %w", err)
	}
	if f.namespace != "" {
		if err := consumer.ValidateNamespace(f.namespace); err != nil {
			return filter, fmt.Errorf("--namespace: %w", err)
		}
	}
	if f.pod == "" {
		return filter, nil
	}
	ns, name, ok := strings.Cut(f.pod, "/")
	if !ok {
		filter.PodUID = f.pod
		return filter, nil
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return filter, fmt.Errorf("--pod %q: want namespace/name or a pod UID", f.pod)
	}
	if f.namespace != "" && f.namespace != ns {
		return filter, fmt.Errorf("--pod %q is not in --namespace %q", f.pod, f.namespace)
	}
	if err := consumer.ValidateNamespace(ns); err != nil {
		return filter, fmt.Errorf("--pod %q: %w", f.pod, err)
	}
	filter.Namespace, filter.Pod = ns, name
	return filter, nil
}

// describe names the flags' selection, for the message that it matched
// nothing.
func (f *psFlags) describe() string {
	var parts []string
	for _, p := range []struct{ name, v string }{{"--node", f.node}, {"--namespace", f.namespace}, {"--pod", f.pod}, {"--selector", f.selector}} {
		if p.v != "" {
			parts = append(parts, p.name+" "+p.v)
		}
	}
	if f.failed {
		parts = append(parts, "--failed")
	}
	return strings.Join(parts, " ")
}

// psPrinter prints ps's table or JSON lines.
type psPrinter struct {
	f   *psFlags
	w   io.Writer
	now func() time.Time
	// widths are the column widths of the table printed first, which the
	// rows of --watch keep; a longer value pushes the rest of its row.
	widths []int
	shown  int // rows listed
	// known holds the last entry of every container watched, to name
	// a container in the row of its removal, which carries no event.
	known map[string]consumer.ContainerState
}

// which says which containers the list shows.
func (p *psPrinter) which() string {
	if p.f.failed {
		return "failed"
	}
	if p.f.all {
		return "known"
	}
	return "running"
}

// shows reports whether the list shows c: sandboxes only with
// --sandboxes, exited containers only with --all.
func (p *psPrinter) shows(c consumer.ContainerState) bool {
	if c.Event.Data.Container.Sandbox && !p.f.sandboxes || !p.selects(c) {
		return false
	}
	return p.f.all || p.f.failed || c.Event.Data.State == "running"
}

// selects reports whether c matches --selector and --failed, which the
// state bucket's keys do not carry.
func (p *psPrinter) selects(c consumer.ContainerState) bool {
	return p.f.labels.Matches(c.Event.Data.Pod.Labels) && (!p.f.failed || consumer.Failed(c.Event))
}

// list prints the containers of the starting state, sorted by node,
// namespace, pod and container name.
func (p *psPrinter) list(cs []consumer.ContainerState) error {
	p.known = make(map[string]consumer.ContainerState, len(cs))
	for _, c := range cs {
		p.known[c.Key] = c
	}
	cs = slices.DeleteFunc(cs, func(c consumer.ContainerState) bool { return !p.shows(c) })
	slices.SortFunc(cs, func(a, b consumer.ContainerState) int {
		return cmp.Or(cmp.Compare(a.Ref.Node, b.Ref.Node), cmp.Compare(a.Ref.Namespace, b.Ref.Namespace),
			cmp.Compare(a.Ref.Pod, b.Ref.Pod), cmp.Compare(containerName(a), containerName(b)), cmp.Compare(a.Key, b.Key))
	})
	p.shown = len(cs)
	if p.f.json {
		for _, c := range cs {
			if err := p.printJSON("listed", c); err != nil {
				return err
			}
		}
		return nil
	}
	rows := [][]string{psColumns}
	for _, c := range cs {
		rows = append(rows, p.row(c, ""))
	}
	p.widths = make([]int, len(psColumns))
	if p.f.watch {
		// Room for what changes print most, so that they stay in line.
		p.widths[4], p.widths[5] = len("removed"), len("137 (OOMKilled)")
	}
	for _, r := range rows {
		for i, v := range r {
			p.widths[i] = max(p.widths[i], len(v))
		}
	}
	for _, r := range rows {
		if err := p.printRow(r); err != nil {
			return err
		}
	}
	return nil
}

// change prints a change of --watch: every update (a container that exits
// is shown exiting, whether or not --all), and every removal, named from
// what ps last knew of the container.
func (p *psPrinter) change(ch consumer.StateChange) error {
	c := ch.Container
	op, state := "updated", ""
	if ch.Op == consumer.StateRemoved {
		op, state = "removed", "removed"
		if last, ok := p.known[c.Key]; ok {
			c.Event = last.Event
		}
		delete(p.known, c.Key)
	} else {
		p.known[c.Key] = c
	}
	if c.Event.Data.Container.Sandbox && !p.f.sandboxes || !p.f.labels.Matches(c.Event.Data.Pod.Labels) {
		return nil
	}
	if p.f.failed && !consumer.Failed(c.Event) {
		return nil
	}
	if p.f.json {
		if ch.Op == consumer.StateRemoved {
			c.Event = consumer.Event{}
		}
		return p.printJSON(op, c)
	}
	return p.printRow(p.row(c, state))
}

// row returns the table row of c; state, if set, replaces its state.
func (p *psPrinter) row(c consumer.ContainerState, state string) []string {
	d := c.Event.Data
	if state == "" {
		state = cmp.Or(d.State, "unknown")
	}
	exit := ""
	if code, ok := c.Event.ExitCode(); ok {
		exit = strconv.Itoa(int(code))
		if d.Reason != "" {
			exit += " (" + d.Reason + ")"
		}
	}
	age := ""
	if started := cmp.Or(ptrTime(d.StartedAt), c.Event.Time); !started.IsZero() && state != "removed" {
		age = humanAge(p.now().Sub(started))
	}
	restarts := strconv.FormatUint(uint64(d.Container.Attempt), 10)
	return []string{c.Ref.Node, c.Ref.Namespace, cmp.Or(c.Ref.Pod, c.Ref.PodUID), containerName(c), state, exit, restarts, age}
}

// containerName is the container's name, "(sandbox)" for a pod sandbox, or
// its ID (shortened as crictl does) when the name is not known.
func containerName(c consumer.ContainerState) string {
	d := c.Event.Data
	switch {
	case d.Container.Sandbox:
		return "(sandbox)"
	case d.Container.Name != "":
		return d.Container.Name
	}
	id := c.Ref.ContainerID
	return id[:min(len(id), 13)]
}

func ptrTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// printRow prints r in the table's columns, three spaces apart as crictl
// does.
func (p *psPrinter) printRow(r []string) error {
	var b strings.Builder
	for i, v := range r {
		b.WriteString(v)
		if i < len(r)-1 {
			w := 0
			if i < len(p.widths) {
				w = p.widths[i]
			}
			b.WriteString(strings.Repeat(" ", max(w-len(v), 0)+3))
		}
	}
	line := strings.TrimRight(b.String(), " ") + "\n"
	if _, err := io.WriteString(p.w, line); err != nil {
		return &outputError{err: err}
	}
	return nil
}

// psJSON is one line of ps --json.
type psJSON struct {
	Op          string          `json:"op"`
	Key         string          `json:"key"`
	Node        string          `json:"node"`
	Namespace   string          `json:"namespace"`
	Pod         string          `json:"pod"`
	PodUID      string          `json:"podUID"`
	ContainerID string          `json:"containerID"`
	Revision    uint64          `json:"revision"`
	Event       json.RawMessage `json:"event,omitempty"`
}

func (p *psPrinter) printJSON(op string, c consumer.ContainerState) error {
	line := psJSON{Op: op, Key: c.Key, Node: c.Ref.Node, Namespace: c.Ref.Namespace, Pod: c.Ref.Pod,
		PodUID: c.Ref.PodUID, ContainerID: c.Ref.ContainerID, Revision: c.Revision}
	if c.Event.Type != "" {
		ce, err := c.Event.CloudEventJSON()
		if err != nil {
			return err
		}
		line.Event = ce
	}
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	if _, err := p.w.Write(append(b, '\n')); err != nil {
		return &outputError{err: err}
	}
	return nil
}

// humanAge renders d as kubectl's AGE column does, to two units at most:
// 45s, 5m30s, 120m, 3h20m, 30h, 4d5h, 30d.
func humanAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < 10*time.Minute:
		m, s := int(d.Minutes()), int(d.Seconds())%60
		if s == 0 {
			return strconv.Itoa(m) + "m"
		}
		return fmt.Sprintf("%dm%ds", m, s)
	case d < 3*time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 8*time.Hour:
		h, m := int(d.Hours()), int(d.Minutes())%60
		if m == 0 {
			return strconv.Itoa(h) + "h"
		}
		return fmt.Sprintf("%dh%dm", h, m)
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h"
	case d < 8*24*time.Hour:
		days, h := int(d.Hours())/24, int(d.Hours())%24
		if h == 0 {
			return strconv.Itoa(days) + "d"
		}
		return fmt.Sprintf("%dd%dh", days, h)
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}
