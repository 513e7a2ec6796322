package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/consumer"
	"github.com/pleg-bridge/pleg-bridge/schemas"
)

// stateLookupTimeout bounds a read of the state bucket that only helps the
// user: the completion of a flag's value, and tail's hint that it knows no
// such pod or node. A shell waiting on Tab, or a tail about to follow,
// does not wait longer for a NATS server that is away or slow.
const stateLookupTimeout = 2 * time.Second

// stateFlags points at the flags of a command that select containers of
// the state bucket, and at where the bucket is. Completion reads them
// when it runs: cobra has parsed the flags before the one being completed.
type stateFlags struct {
	nats                 *natsFlags
	bucket               *string
	node, namespace, pod *string
}

// registerStateCompletions makes --node, --namespace and --pod of c
// complete from the state bucket, as kubectl completes names from the API:
// the values the bucket's containers have, narrowed by the other two flags
// when they are set. When NATS or the bucket cannot be read within
// stateLookupTimeout, they complete to nothing, never to file names, and
// say why on stderr, which the shells' scripts do not show.
func registerStateCompletions(c *cobra.Command, f stateFlags) {
	for _, flag := range []string{"node", "namespace", "pod"} {
		_ = c.RegisterFlagCompletionFunc(flag, f.complete(flag))
	}
}

// complete is the completion of the flag named flag.
func (f stateFlags) complete(flag string) cobra.CompletionFunc {
	return func(c *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		filter := f.filter(flag)
		if ns, _, ok := strings.Cut(toComplete, "/"); ok && flag == "pod" && ns != "" {
			filter.Namespace = ns // the server sends only that namespace's containers
		}
		cs, err := listStateAt(c.Context(), f.nats, *f.bucket, filter)
		if err != nil {
			fmt.Fprintf(c.ErrOrStderr(), "complete --%s: %v\n", flag, err)
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []string
		for _, cs := range cs {
			if n := stateName(flag, cs.Ref); n != "" && strings.HasPrefix(n, toComplete) {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		return slices.Compact(names), cobra.ShellCompDirectiveNoFileComp
	}
}

// filter returns the state filter of the flags other than except, which
// is being completed. A --pod that does not parse selects nothing more.
func (f stateFlags) filter(except string) consumer.StateFilter {
	var sel consumer.StateFilter
	if except != "node" {
		sel.Node = *f.node
	}
	if except != "namespace" {
		sel.Namespace = *f.namespace
	}
	if except != "pod" {
		if uid, ns, name, err := parsePod(*f.pod); err == nil {
			sel.PodUID, sel.Pod = uid, name
			sel.Namespace = cmp.Or(ns, sel.Namespace)
		}
	}
	return sel
}

// stateName is the value of flag that names a container of the bucket:
// its node, its namespace, or its pod as namespace/name.
func stateName(flag string, r schemas.StateRef) string {
	switch flag {
	case "node":
		return r.Node
	case "namespace":
		return r.Namespace
	case "pod":
		if r.Namespace != "" && r.Pod != "" {
			return r.Namespace + "/" + r.Pod
		}
	}
	return ""
}

// listStateAt connects to the NATS server of nf and lists the containers
// of bucket that filter selects, within stateLookupTimeout.
func listStateAt(ctx context.Context, nf *natsFlags, bucket string, filter consumer.StateFilter) ([]consumer.ContainerState, error) {
	deadline := time.Now().Add(stateLookupTimeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// nats.Connect takes no context: its timeout bounds the dial, and the
	// handshake with a server that accepts and then says nothing.
	ctx, nc, js, err := nf.connect(ctx, "pleg-bridge completion", nats.Timeout(time.Until(deadline)), nats.NoReconnect())
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	cs, err := consumer.ListState(ctx, js, consumer.StateOptions{Bucket: bucket, Filter: filter})
	if rerr := refusal(ctx); rerr != nil {
		return nil, rerr
	}
	return cs, err
}
