package store

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// storeKinds lists the backends; each opens a store, and opens the same
// data again after it is closed.
var storeKinds = []struct {
	name   string
	opener func(t *testing.T) func() (Backend, error)
}{
	{"bbolt", func(t *testing.T) func() (Backend, error) {
		path := filepath.Join(t.TempDir(), "tracker.db")
		return func() (Backend, error) { return OpenBolt(path, Hooks{}) }
	}},
	{"etcd", func(t *testing.T) func() (Backend, error) {
		cli, prefix := etcdClient(t), etcdPrefix("store")
		return func() (Backend, error) { return OpenEtcd(cli, prefix, nil, Hooks{}), nil }
	}},
}

// Records as a tracker stores them (the tracker's own types are its
// own; these stand in for them with the same shapes).
type (
	jobRecord struct {
		Job      proto.BuildJob `msgpack:"job"`
		QueuedAt time.Time      `msgpack:"queued_at"`
	}
	leaseRecord struct {
		Lease   proto.Lease `msgpack:"lease"`
		User    string      `msgpack:"user"`
		Granted time.Time   `msgpack:"granted"`
	}
	artifactRecord struct {
		Size    int64     `msgpack:"size"`
		Created time.Time `msgpack:"created"`
	}
)

// leases decodes a snapshot's leases.
func leases(t *testing.T, snap Snapshot) []leaseRecord {
	t.Helper()
	var out []leaseRecord
	check.NoError(t, Each(snap, Leases, func(_ string, l *leaseRecord) error {
		out = append(out, *l)
		return nil
	}))
	return out
}

// TestBackend checks the Backend contract on every backend: changes
// applied in order and together, a failed apply changing nothing, one
// record read back as written, and everything read back after a reopen.
func TestBackend(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) { testBackend(t, kind.opener(t)) })
	}
}

func testBackend(t *testing.T, open func() (Backend, error)) {
	st, err := open()
	check.NoError(t, err)
	now := time.Now().UTC().Truncate(time.Millisecond)
	job := func(id string, state proto.JobState) jobRecord {
		return jobRecord{Job: proto.BuildJob{ID: id, Name: "n-" + id, State: state}, QueuedAt: now}
	}
	lease := leaseRecord{Lease: proto.Lease{ID: "l-1", Token: "tok", NodeID: "device-1", Expires: now.Add(time.Hour)}, User: "alice", Granted: now}
	check.NoError(t, st.Wait(st.Apply(
		Put(Modules, "j-1", "module one"),
		Put(Meta, MetaNextJob, uint64(3)),
		Put(Jobs, "j-1", job("j-1", proto.JobQueued)),
	)))
	// Later changes win over earlier ones, in the order they were queued,
	// whichever goroutine commits them.
	st.Apply(Put(Jobs, "j-2", job("j-2", proto.JobQueued)), Put(Modules, "j-2", "two"))
	st.Apply(Put(Jobs, "j-2", job("j-2", proto.JobSucceeded)), Delete(Modules, "j-2"))
	st.Apply(Put(Leases, "l-1", lease), Put(Leases, "l-2", lease))
	st.Apply(Delete(Leases, "l-2"))
	st.Apply(Put(Artifacts, "ab", artifactRecord{Size: 7, Created: now}))
	check.NoError(t, st.Wait(st.Apply(Put(Creds, "device-1", map[string]any{"node_id": "device-1", "role": string(proto.RoleDevice)}))))
	// A change that cannot be encoded fails alone, and changes nothing.
	err = st.Wait(st.Apply(Put(Jobs, "j-3", job("j-3", proto.JobQueued)), Put(Leases, "bad", make(chan int))))
	check.Error(t, err, "encode leases/bad")

	b, ok, err := st.Get(Artifacts, "ab")
	check.NoError(t, err)
	var rec artifactRecord
	check.True(t, ok, "artifact ab")
	check.NoError(t, Decode(b, &rec))
	check.Equal(t, rec.Size, int64(7))
	_, ok, err = st.Get(Artifacts, "cd")
	check.NoError(t, err)
	check.True(t, !ok, "an artifact never stored")
	check.NoError(t, st.Close())
	check.NoError(t, st.Close())
	check.Error(t, st.Wait(st.Apply(Delete(Jobs, "j-1"))), "closed")

	st, err = open()
	check.NoError(t, err)
	defer st.Close()
	snap, err := st.Load()
	check.NoError(t, err)
	next, err := snap.NextJob()
	check.NoError(t, err)
	check.Equal(t, next, uint64(3))
	var jobs []jobRecord
	check.NoError(t, Each(snap, Jobs, func(_ string, j *jobRecord) error {
		jobs = append(jobs, *j)
		return nil
	}))
	check.Equal(t, len(jobs), 2)
	check.Equal(t, jobs[0].Job.ID, "j-1")
	check.Equal(t, jobs[1].Job.State, proto.JobSucceeded)
	var module string
	m, ok := snap.Value(Modules, "j-1")
	check.True(t, ok, "module of j-1")
	check.NoError(t, Decode(m, &module))
	check.Equal(t, module, "module one")
	_, ok = snap.Value(Modules, "j-2")
	check.True(t, !ok, "the module of a final job is deleted")
	ls := leases(t, snap)
	check.Equal(t, len(ls), 1)
	check.Equal(t, ls[0].User, "alice")
	check.True(t, ls[0].Granted.Equal(now), ls[0].Granted)
	check.Equal(t, len(snap[Artifacts]), 1)
	check.Equal(t, len(snap[Creds]), 1)
	check.Equal(t, len(snap[Meta]), 1) // the log position is the backend's own
	// A record that does not decode is named.
	err = Each(snap, Jobs, func(string, *int) error { return nil })
	check.Error(t, err, `jobs record "j-1"`)
}

// crash ends st as a kill would: no checkpoint, no final write.
func crash(st *Bolt) {
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
	st, err := OpenBolt(path, Hooks{})
	check.NoError(t, err)
	close(st.ckptStop) // no checkpoint from here on
	<-st.ckptDone
	st.ckptStop, st.ckptDone = make(chan struct{}), make(chan struct{})
	go func() { <-st.ckptStop; close(st.ckptDone) }()
	lease := func(id string) leaseRecord { return leaseRecord{Lease: proto.Lease{ID: id}, User: "u-" + id} }
	for i := range 5 {
		id := string(rune('a' + i))
		check.NoError(t, st.Wait(st.Apply(Put(Leases, id, lease(id)))))
	}
	check.NoError(t, st.Wait(st.Apply(Delete(Leases, "b"))))
	big := strings.Repeat("x", walSize) // cannot be logged
	check.NoError(t, st.Wait(st.Apply(Put(Modules, "j-big", big))))
	check.NoError(t, st.Wait(st.Apply(Put(Leases, "f", lease("f")))))
	crash(st)

	st, err = OpenBolt(path, Hooks{})
	check.NoError(t, err)
	snap, err := st.Load()
	check.NoError(t, err)
	var ids []string
	for _, l := range leases(t, snap) {
		ids = append(ids, l.Lease.ID)
	}
	check.Equal(t, strings.Join(ids, ","), "a,c,d,e,f")

	// Log two more, tear the second: only the first comes back.
	close(st.ckptStop)
	<-st.ckptDone
	st.ckptStop, st.ckptDone = make(chan struct{}), make(chan struct{})
	go func() { <-st.ckptStop; close(st.ckptDone) }()
	check.NoError(t, st.Wait(st.Apply(Put(Leases, "g", lease("g")))))
	off := st.log.off
	check.NoError(t, st.Wait(st.Apply(Put(Leases, "h", lease("h")))))
	crash(st)
	f, err := os.OpenFile(path+".wal", os.O_RDWR, 0)
	check.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff}, off+walHeaderSize+3)
	check.NoError(t, err)
	f.Close()
	st, err = OpenBolt(path, Hooks{})
	check.NoError(t, err)
	snap, err = st.Load()
	check.NoError(t, err)
	ids = nil
	for _, l := range leases(t, snap) {
		ids = append(ids, l.Lease.ID)
	}
	check.Equal(t, strings.Join(ids, ","), "a,c,d,e,f,g")
	// The log starts over after recovery: later batches chain on.
	check.NoError(t, st.Wait(st.Apply(Delete(Leases, "a"))))
	check.NoError(t, st.Close())
	st, err = OpenBolt(path, Hooks{})
	check.NoError(t, err)
	defer st.Close()
	snap, err = st.Load()
	check.NoError(t, err)
	check.Equal(t, len(leases(t, snap)), 5)
	rec, ok, err := st.Get(Artifacts, "none")
	check.NoError(t, err)
	check.True(t, !ok, rec)
}
