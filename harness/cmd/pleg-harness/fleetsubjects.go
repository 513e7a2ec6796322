package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pleg-bridge/pleg-bridge/harness/fleet"
	"github.com/pleg-bridge/pleg-bridge/internal/cli"
)

// newFleetSubjectsCommand is pleg-harness fleet subjects: nats-server's
// memory per distinct subject, per subject layout.
func newFleetSubjectsCommand(env commandEnv) *cobra.Command {
	var (
		o       fleet.SubjectMemOptions
		layouts string
		windows string
	)
	c := &cobra.Command{
		Use:   "subjects",
		Short: "Measure nats-server's memory per distinct subject, for each subject layout",
		Long: `Measure nats-server's memory per distinct subject, for each subject layout.

The same messages (--pods pods of --events-per-pod events over --nodes nodes
and --namespaces namespaces, with the bridge's Nats-Msg-Id) are published in
each layout to a stream configured as the bridge creates it (file storage,
max age 7 days), on one nats-server (a process of its own, 1 replica) with
a fresh store; the server is then restarted on its store (SIGTERM, started
again) and its resident memory sampled for --settle. The same is done for
an empty stream, the baseline. It prints one table: per layout and
duplicate window, the distinct subjects, the RSS after the restart (the
lowest sample), per subject and per pod over the baseline, and the peak RSS
during the ingest, as ranges over --runs runs. docs/measurements.md says
what the figures mean. Layouts:
  legacy          pleg.<node>.<uid>.<type>      (before the namespace token)
  current         pleg.<node>.<ns>.<uid>.<type> (DESIGN.md §4)
  pod             pleg.<node>.<ns>.<uid>        (one subject per pod)
  node-namespace  pleg.<node>.<ns>              (an archive stream after a subject transform)
With the defaults it stores 375 MB a measurement, 27 measurements in all;
about 16 minutes on 2 vCPUs.`,
		Example: `  pleg-harness fleet subjects                                   # every layout, 2m and no dedup, 3 runs
  pleg-harness fleet subjects --runs 1 --layouts current,pod --duplicate-windows none
  pleg-harness fleet subjects --pods 10000 --settle 5s          # a quick look`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if layouts != "" {
				o.Layouts = strings.Split(layouts, ",")
			}
			for _, w := range strings.Split(windows, ",") {
				if w == "none" {
					o.DuplicateWindows = append(o.DuplicateWindows, 0)
					continue
				}
				d, err := time.ParseDuration(w)
				if err != nil || d <= 0 {
					return cli.UsageErrorf(c.CommandPath(), "--duplicate-windows=%q: %q is neither a positive duration nor none", windows, w)
				}
				o.DuplicateWindows = append(o.DuplicateWindows, d)
			}
			return runFleetSubjects(c.Context(), o, env.stdout)
		},
	}
	f := c.Flags()
	f.IntVar(&o.Pods, "pods", fleet.DefaultSubjectMemPods, "pods whose events are published")
	f.IntVar(&o.Nodes, "nodes", fleet.DefaultSubjectMemNodes, "nodes the pods are spread over")
	f.IntVar(&o.Namespaces, "namespaces", fleet.DefaultSubjectMemNamespaces, "namespaces the pods are spread over")
	f.IntVar(&o.EventsPerPod, "events-per-pod", fleet.DefaultSubjectMemEventsPerPod, "events per pod, the event types in turn")
	f.IntVar(&o.DataSize, "size", fleet.DefaultSubjectMemDataSize, "bytes of data a message (the default stores about 1,250 B a message with the current layout's subject and headers)")
	f.StringVar(&layouts, "layouts", strings.Join(fleet.AllLayouts, ","), "layouts to measure, comma-separated")
	f.StringVar(&windows, "duplicate-windows", "2m,none", `the streams' duplicate windows, comma-separated; "none" is the server's least, 100ms`)
	f.IntVar(&o.Runs, "runs", fleet.DefaultSubjectMemRuns, "times each measurement is made")
	f.DurationVar(&o.Settle, "settle", fleet.DefaultSubjectMemSettle, "how long the restarted server's memory is sampled")
	f.StringVar(&o.Dir, "dir", "", "run directory: each measurement's server log (default: a new temporary directory, removed if the run passes); the stores are removed once measured")
	return c
}

// runFleetSubjects is the fleet subjects subcommand.
func runFleetSubjects(ctx context.Context, o fleet.SubjectMemOptions, stdout io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("fleet subjects: find this binary to run the server: %w", err)
	}
	o.ChildCommand = []string{self, "fleet", "child"}
	temporary := o.Dir == ""
	if temporary {
		if o.Dir, err = os.MkdirTemp("", "pleg-subjects-"); err != nil {
			return fmt.Errorf("fleet subjects: %w", err)
		}
	}
	o.Stdout = stdout
	rep, err := fleet.MeasureSubjectMemory(ctx, o)
	if err != nil {
		if temporary && os.Remove(o.Dir) == nil {
			// Empty: the options were refused before any server ran.
			return fmt.Errorf("fleet subjects: %w", err)
		}
		return fmt.Errorf("fleet subjects (run directory %s): %w", o.Dir, err)
	}
	fmt.Fprintln(stdout)
	if err := rep.Table(stdout); err != nil {
		return err
	}
	if temporary {
		return os.RemoveAll(o.Dir)
	}
	return nil
}
