package cli

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

// clusterTrackers are `kiln tracker` processes, each with an embedded etcd
// member, forming one etcd cluster and one replicated tracker.
type clusterTrackers struct {
	names []string
	args  [][]string
	procs []*proc
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// startClusterTrackers starts n trackers on a cluster of their embedded
// etcd members, sharing one artifact directory (as replicas on one
// ReadWriteMany volume would), and points f at all of them (f.trackerAddr
// is the list).
func startClusterTrackers(t *testing.T, f *procFleet, n int) *clusterTrackers {
	t.Helper()
	c := &clusterTrackers{}
	var listens, peers, clients []string
	for i := range n {
		c.names = append(c.names, fmt.Sprintf("t%d", i))
		listens = append(listens, freeAddr(t))
		peers = append(peers, c.names[i]+"=https://"+freeAddr(t))
		clients = append(clients, "https://"+freeAddr(t))
	}
	for i := range n {
		args := []string{"tracker", "--listen", listens[i], "--advertise", listens[i],
			"--data", filepath.Join(f.dir, c.names[i]), "--artifacts", filepath.Join(f.dir, "artifacts"),
			"--token-file", f.tokFile, "--heartbeat", f.heartbeat.String(),
			"--cluster-name", c.names[i], "--cluster-peers", strings.Join(peers, ","), "--cluster-client-url", clients[i]}
		c.args = append(c.args, args)
		c.procs = append(c.procs, startProc(t, "tracker "+c.names[i], args...))
	}
	f.trackerAddr = strings.Join(listens, ",")
	eventually(t, "the replicated tracker answers", func() bool {
		_, _, err := runApp(t, "query", "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--json")
		return err == nil
	})
	return c
}

// leader returns the index of the tracker that leads: the live one whose
// log last named itself the leader.
func (c *clusterTrackers) leader(t *testing.T) int {
	t.Helper()
	at := -1
	eventually(t, "a tracker leads", func() bool {
		for i, p := range c.procs {
			if p.alive() && lastLeaderSelf(p.out.String()) {
				at = i
				return true
			}
		}
		return false
	})
	return at
}

// lastLeaderSelf reports whether the last "tracker leader" line of a
// tracker's log names itself.
func lastLeaderSelf(log string) bool {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "tracker leader") {
			return strings.Contains(lines[i], "self=true")
		}
	}
	return false
}

// restart starts tracker i again with its arguments and data: it rejoins
// the cluster.
func (c *clusterTrackers) restart(t *testing.T, i int) {
	t.Helper()
	c.procs[i] = startProc(t, "tracker "+c.names[i]+" (restarted)", c.args[i]...)
}

// TestHAClusterFaults runs the fault test on three trackers over a
// 3-member embedded etcd: kill -9 of the leader tracker (its etcd member
// with it), then, once it is back, kill -9 of another member.
func TestHAClusterFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet of processes through tracker and etcd member crashes")
	}
	failKernels(t) // skips without a C compiler
	f := newProcFleet(t, 250*time.Millisecond)
	c := startClusterTrackers(t, f, 3)
	runHAFaults(t, f, func(lg *haLedger) {
		i := c.leader(t)
		c.procs[i].kill9(t)
		n := lg.done()
		eventually(t, "two cycles under the new leader", func() bool { return lg.done() >= n+2 })
		c.restart(t, i)
		j := c.leader(t)
		k := (j + 1) % len(c.procs) // a member that does not lead
		c.procs[k].kill9(t)
		n = lg.done()
		eventually(t, "two cycles without that member", func() bool { return lg.done() >= n+2 })
		c.restart(t, k)
	})
}
