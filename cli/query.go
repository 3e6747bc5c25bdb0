package cli

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func queryCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "query",
		Usage:     "show a tracker's devices, queues, compiler nodes and recent build jobs",
		UsageText: "kiln query --tracker HOST:PORT [--jobs N] [--jobs-before ID] [--json]",
		Description: `Prints the tracker's view of the fleet: per device key, grouped by the
devices' architecture (amd64, arm64, riscv64), how many devices are free,
busy, lost or quarantined and how many requests wait; every device and
compiler node with its state and address; each request queue in order (so a
waiting client can see its position); the build queue in the order jobs
are handed to compiler nodes (interactive jobs such as kiln build --tracker
before bulk ones such as kiln tune's candidates, then by priority, then
age), each with its position and an ETA from the recent jobs' build times;
and the most recent build jobs. With
--json it prints the summary as one JSON object.

Examples:
   kiln query --tracker 127.0.0.1:9190
   kiln query --tracker tracker:9190 --token-file token --json | jq '.keys'`,
		Flags: append([]ucli.Flag{
			trackerFlag("HOST:PORT of the tracker", true),
			&ucli.IntFlag{Name: "jobs", Value: 10, Usage: "recent build jobs to list (at most 1000 a page)"},
			&ucli.StringFlag{Name: "jobs-before", Usage: "list the jobs submitted before this job id (the next page)"},
			&ucli.BoolFlag{Name: "json", Usage: "print one JSON object for machines"},
		}, connFlags()...),
		OnUsageError: usageError,
		Action:       runQuery,
	}
}

func runQuery(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	tok, tlsCfg, err := clientAuth(c)
	if err != nil {
		return err
	}
	tr, err := client.DialTracker(c.Context, c.String("tracker"), client.TrackerOptions{Token: tok, TLS: tlsCfg})
	if err != nil {
		return fmt.Errorf("query: %w", err)
	}
	defer tr.Close()
	sum, err := tr.QueryPage(c.Context, proto.QueryArgs{Jobs: c.Int("jobs"), JobsBefore: c.String("jobs-before")})
	if err != nil {
		return fmt.Errorf("query: %w", err)
	}
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(sum)
	}
	printSummary(c.App.Writer, sum)
	return nil
}

// keyArches names each device key's architecture (TripleArch of its
// devices' triples; several joined by ", " when a key spans them).
func keyArches(devs []proto.NodeSummary) map[string]string {
	sets := map[string][]string{}
	for _, n := range devs {
		if a := proto.TripleArch(n.Attrs.Triple); a != "" && !slices.Contains(sets[n.Key], a) {
			sets[n.Key] = append(sets[n.Key], a)
		}
	}
	out := map[string]string{}
	for k, as := range sets {
		slices.Sort(as)
		out[k] = strings.Join(as, ", ")
	}
	return out
}

// printSummary writes the tracker summary as tables: the device keys
// grouped by architecture, the nodes, the request queues, the build jobs.
func printSummary(w io.Writer, s proto.TrackerSummary) {
	// Keys grouped by their devices' architecture (boards of one kind
	// together), then by name.
	arches := keyArches(s.Devices)
	keys := slices.Clone(s.Keys)
	slices.SortStableFunc(keys, func(a, b proto.KeySummary) int {
		return cmp.Or(strings.Compare(arches[a.Key], arches[b.Key]), strings.Compare(a.Key, b.Key))
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ARCH\tKEY\tFREE\tBUSY\tLOST\tQUARANTINED\tWAITING")
	for _, k := range keys {
		arch := arches[k.Key]
		if arch == "" {
			arch = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", arch, k.Key, k.Free, k.Busy, k.Lost, k.Quarantined, k.Pending)
	}
	if len(s.Keys) == 0 {
		fmt.Fprintln(tw, "(no devices registered)\t\t\t\t\t\t")
	}
	tw.Flush()

	nodes := append(append([]proto.NodeSummary(nil), s.Devices...), s.Compiler...)
	if len(nodes) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tROLE\tARCH\tKEY\tSTATE\tADDRESS\tLAST SEEN\tDETAILS")
		for _, n := range nodes {
			detail := strings.Join(n.Attrs.DeviceNames, ", ")
			if n.Role == proto.NodeCompiler {
				detail = strings.Join(n.Attrs.Serves(), ", ") + "; " + n.Attrs.Compiler
			}
			if n.Attrs.Emulated != "" {
				detail += " (emulated: " + n.Attrs.Emulated + ")"
			}
			arch := proto.TripleArch(n.Attrs.Triple)
			if arch == "" {
				arch = "-"
			}
			if n.LastError != "" {
				detail += " (last error: " + n.LastError + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s ago\t%s\n", n.NodeID, n.Role, arch, n.Key, n.State, n.Addr,
				s.Now.Sub(n.LastSeen).Round(100*time.Millisecond), detail)
		}
		tw.Flush()
	}
	for _, q := range s.Queues {
		if len(q.Waiting) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nqueue %q:\n", q.Queue)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  POSITION\tPRIORITY\tUSER\tWAITING FOR")
		for _, t := range q.Waiting {
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\n", t.Position, t.Priority, t.User, s.Now.Sub(t.Since).Round(100*time.Millisecond))
		}
		tw.Flush()
	}
	if len(s.BuildQueue) > 0 {
		fmt.Fprintf(w, "\nbuild queue (interactive before bulk, then by priority, then age):\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  POSITION\tJOB\tCLASS\tPRIORITY\tNAME\tTARGET\tOWNER\tWAITING FOR\tETA")
		for _, j := range s.BuildQueue {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", j.Position, j.ID, jobClass(j.Class), j.Priority, j.Name, j.Target,
				j.Owner, s.Now.Sub(j.Submitted).Round(time.Second), fmtETA(j.ETA))
		}
		tw.Flush()
	}
	for _, t := range s.TVMServers {
		fmt.Fprintf(w, "TVM server %s at %s: %d free, %d pending\n", t.Key, t.Addr, t.Free, t.Pending)
	}
	if len(s.Jobs) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tNAME\tTARGET\tSTATE\tNODE\tSUBMITTED\tMESSAGE")
		for _, j := range s.Jobs {
			msg := j.Error
			if msg == "" {
				msg = j.Message
			}
			if len(msg) > 80 {
				msg = msg[:77] + "..."
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s ago\t%s\n", j.ID, j.Name, j.Target, j.State, j.Node,
				s.Now.Sub(j.Submitted).Round(time.Second), strings.ReplaceAll(msg, "\n", " "))
		}
		tw.Flush()
		if s.MoreJobsBefore != "" {
			fmt.Fprintf(w, "(older jobs: --jobs-before %s)\n", s.MoreJobsBefore)
		}
	}
	fmt.Fprintf(w, "\n%d lease(s) held", s.Leases)
	for _, st := range []proto.JobState{proto.JobQueued, proto.JobRunning, proto.JobSucceeded, proto.JobFailed, proto.JobCancelled} {
		if n := s.JobCounts[st]; n > 0 {
			fmt.Fprintf(w, ", %d job(s) %s", n, st)
		}
	}
	fmt.Fprintln(w)
}

// jobClass names a job's class (interactive when it has none).
func jobClass(c proto.JobClass) string {
	if c == "" {
		return string(proto.JobInteractive)
	}
	return string(c)
}

// fmtETA shows a queued job's ETA ("-" when the tracker has no estimate:
// no job built yet, or no compiler node for its target).
func fmtETA(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return "~" + d.Round(time.Second).String()
}
