package tracker

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestStateStore checks the stateStore contract on boltStore: changes
// applied in order and together, a failed apply changing nothing, and
// everything read back after a reopen.
func TestStateStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tracker.db")
	st, err := openBoltStore(path)
	check.NoError(t, err)
	now := time.Now().UTC().Truncate(time.Millisecond)
	job := func(id string, state proto.JobState) jobRecord {
		return jobRecord{Job: proto.BuildJob{ID: id, Name: "n-" + id, State: state}, QueuedAt: now}
	}
	lease := leaseRecord{Lease: proto.Lease{ID: "l-1", Token: "tok", NodeID: "device-1", Expires: now.Add(time.Hour)}, User: "alice", Granted: now}
	check.NoError(t, st.wait(st.apply(
		putRecord(tableModules, "j-1", "module one"),
		putRecord(tableMeta, metaNextJob, uint64(3)),
		putRecord(tableJobs, "j-1", job("j-1", proto.JobQueued)),
	)))
	// Later changes win over earlier ones, in the order they were queued,
	// whichever goroutine commits them.
	st.apply(putRecord(tableJobs, "j-2", job("j-2", proto.JobQueued)), putRecord(tableModules, "j-2", "two"))
	st.apply(putRecord(tableJobs, "j-2", job("j-2", proto.JobSucceeded)), deleteRecord(tableModules, "j-2"))
	st.apply(putRecord(tableLeases, "l-1", lease), putRecord(tableLeases, "l-2", lease))
	st.apply(deleteRecord(tableLeases, "l-2"))
	st.apply(putRecord(tableArtifacts, "ab", artifactRecord{Size: 7, Created: now, Used: now}))
	check.NoError(t, st.wait(st.apply(putRecord(tableCreds, "device-1", &credential{NodeID: "device-1", Role: proto.RoleDevice, Hash: "h", Issued: now}))))
	// A change that cannot be encoded fails alone, and changes nothing.
	err = st.wait(st.apply(putRecord(tableJobs, "j-3", job("j-3", proto.JobQueued)), putRecord(tableLeases, "bad", make(chan int))))
	check.Error(t, err, "encode leases/bad")

	rec, ok, err := st.artifact("ab")
	check.NoError(t, err)
	check.True(t, ok && rec.Size == 7, rec)
	_, ok, err = st.artifact("cd")
	check.NoError(t, err)
	check.True(t, !ok, "an artifact never stored")
	check.NoError(t, st.close())
	check.NoError(t, st.close())
	check.Error(t, st.wait(st.apply(deleteRecord(tableJobs, "j-1"))), "closed")

	st, err = openBoltStore(path)
	check.NoError(t, err)
	defer st.close()
	snap, err := st.load()
	check.NoError(t, err)
	check.Equal(t, snap.nextJob, uint64(3))
	check.Equal(t, len(snap.jobs), 2)
	check.Equal(t, snap.jobs[0].rec.Job.ID, "j-1")
	check.Equal(t, snap.jobs[0].module, "module one")
	check.Equal(t, snap.jobs[1].rec.Job.State, proto.JobSucceeded)
	check.Equal(t, snap.jobs[1].module, "")
	check.Equal(t, len(snap.leases), 1)
	check.Equal(t, snap.leases[0].User, "alice")
	check.True(t, snap.leases[0].Granted.Equal(now), snap.leases[0].Granted)
	check.Equal(t, len(snap.artifacts), 1)
	check.Equal(t, len(snap.creds), 1)
	check.Equal(t, snap.creds[0].Role, proto.RoleDevice)
}
