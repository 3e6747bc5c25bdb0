package tracker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// storeKinds lists the stateStore implementations; each opens a store,
// and opens the same data again after it is closed.
var storeKinds = []struct {
	name   string
	opener func(t *testing.T) func() (stateStore, error)
}{
	{"bbolt", func(t *testing.T) func() (stateStore, error) {
		path := filepath.Join(t.TempDir(), "tracker.db")
		return func() (stateStore, error) { return openBoltStore(path, storeHooks{}) }
	}},
	{"etcd", func(t *testing.T) func() (stateStore, error) {
		cli, prefix := etcdClient(t), etcdPrefix("store")
		return func() (stateStore, error) { return openEtcdStore(cli, prefix, nil, storeHooks{}), nil }
	}},
}

// TestStateStore checks the stateStore contract on every store: changes
// applied in order and together, a failed apply changing nothing, and
// everything read back after a reopen.
func TestStateStore(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) { testStateStore(t, kind.opener(t)) })
	}
}

func testStateStore(t *testing.T, open func() (stateStore, error)) {
	st, err := open()
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

	st, err = open()
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

// crash ends st as a kill would: no checkpoint, no final write.
func crash(st *boltStore) {
	close(st.ckptStop)
	<-st.ckptDone
	st.log.close()
	st.db.Close()
}

// TestWALRecovery: batches answered as durable but never checkpointed into
// tracker.db are there after a crash and a reopen; a torn last record is
// dropped with nothing after it; a batch too large for the log goes to
// tracker.db directly.
func TestWALRecovery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tracker.db")
	st, err := openBoltStore(path, storeHooks{})
	check.NoError(t, err)
	close(st.ckptStop) // no checkpoint from here on
	<-st.ckptDone
	st.ckptStop, st.ckptDone = make(chan struct{}), make(chan struct{})
	go func() { <-st.ckptStop; close(st.ckptDone) }()
	lease := func(id string) leaseRecord { return leaseRecord{Lease: proto.Lease{ID: id}, User: "u-" + id} }
	for i := range 5 {
		id := string(rune('a' + i))
		check.NoError(t, st.wait(st.apply(putRecord(tableLeases, id, lease(id)))))
	}
	check.NoError(t, st.wait(st.apply(deleteRecord(tableLeases, "b"))))
	big := strings.Repeat("x", walSize) // cannot be logged
	check.NoError(t, st.wait(st.apply(putRecord(tableModules, "j-big", big))))
	check.NoError(t, st.wait(st.apply(putRecord(tableLeases, "f", lease("f")))))
	crash(st)

	st, err = openBoltStore(path, storeHooks{})
	check.NoError(t, err)
	snap, err := st.load()
	check.NoError(t, err)
	var ids []string
	for _, l := range snap.leases {
		ids = append(ids, l.Lease.ID)
	}
	check.Equal(t, strings.Join(ids, ","), "a,c,d,e,f")

	// Log two more, tear the second: only the first comes back.
	close(st.ckptStop)
	<-st.ckptDone
	st.ckptStop, st.ckptDone = make(chan struct{}), make(chan struct{})
	go func() { <-st.ckptStop; close(st.ckptDone) }()
	check.NoError(t, st.wait(st.apply(putRecord(tableLeases, "g", lease("g")))))
	off := st.log.off
	check.NoError(t, st.wait(st.apply(putRecord(tableLeases, "h", lease("h")))))
	crash(st)
	f, err := os.OpenFile(path+".wal", os.O_RDWR, 0)
	check.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff}, off+walHeaderSize+3)
	check.NoError(t, err)
	f.Close()
	st, err = openBoltStore(path, storeHooks{})
	check.NoError(t, err)
	snap, err = st.load()
	check.NoError(t, err)
	ids = nil
	for _, l := range snap.leases {
		ids = append(ids, l.Lease.ID)
	}
	check.Equal(t, strings.Join(ids, ","), "a,c,d,e,f,g")
	// The log starts over after recovery: later batches chain on.
	check.NoError(t, st.wait(st.apply(deleteRecord(tableLeases, "a"))))
	check.NoError(t, st.close())
	st, err = openBoltStore(path, storeHooks{})
	check.NoError(t, err)
	defer st.close()
	snap, err = st.load()
	check.NoError(t, err)
	check.Equal(t, len(snap.leases), 5)
	rec, ok, err := st.artifact("none")
	check.NoError(t, err)
	check.True(t, !ok, rec)
}
