package tracker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// job is a build job. Its BuildJob never holds the module: while the job
// is queued or running, a module's text is in the module store under
// moduleKey (a single tracker's: out of its heap and of tracker.db) or in
// the state store's modules table (a replica's: etcd, which every replica
// reaches), and module holds only an artifact-format job's digest (proto.StoredFormat).
type job struct {
	proto.BuildJob
	module    string
	moduleKey string // the module's key in Server.modules ("" when none)
	// moduleStored is set when the module's text is in the state store's
	// modules table instead (a replica's, and jobs stored before the
	// module store).
	moduleStored bool
	moduleSize   int64 // the module's bytes, wherever they are
	queuedAt     time.Time
	changed      chan struct{} // closed and replaced on every change
	// conn is the connection a cancel-on-disconnect job belongs to;
	// orphaned, when set, is when it closed (see orphanJobsLocked).
	conn     *proto.Conn
	orphaned time.Time
}

// jobRecord is a job as stored. Its module text lives in the module store
// under ModuleKey (jobs stored before that have it in the modules table).
type jobRecord struct {
	Job        proto.BuildJob `msgpack:"job"`
	QueuedAt   time.Time      `msgpack:"queued_at"`
	ModuleKey  string         `msgpack:"module_key,omitempty"`
	ModuleSize int64          `msgpack:"module_size,omitempty"`
}

const (
	defaultBuildWait = 10 * time.Second
	maxBuildWait     = time.Minute
)

func (s *Server) persistJobLocked(j *job) <-chan error {
	rec := jobRecord{Job: j.BuildJob, QueuedAt: j.queuedAt, ModuleKey: j.moduleKey, ModuleSize: j.moduleSize}
	rec.Job.Module = ""
	final := j.State.Final()
	if final {
		return s.st.Apply(store.Delete(store.Modules, rec.Job.ID), store.Put(store.Jobs, rec.Job.ID, rec))
	}
	return s.st.Apply(store.Put(store.Jobs, rec.Job.ID, rec))
}

// changeJobLocked bumps j's Seq, persists it and wakes its waiters.
func (s *Server) changeJobLocked(j *job) <-chan error {
	j.Seq++
	notify(&j.changed)
	var key string
	if j.State.Final() {
		j.module, j.moduleSize, j.moduleStored = "", 0, false
		key, j.moduleKey = j.moduleKey, ""
		if !j.Finished.IsZero() && !j.Started.IsZero() {
			s.m.jobRun.Observe(j.Finished.Sub(j.Started).Seconds())
			if j.State != proto.JobCancelled {
				s.builtLocked(j.Finished.Sub(j.Started))
			}
		}
	}
	durable := s.persistJobLocked(j)
	if key != "" {
		durable = s.removeModuleAfter(key, durable)
	}
	return durable
}

// Limits on what a job carries besides its module: they are shown to
// everyone by query and kept in the store.
const (
	maxJobName        = 256
	maxJobTarget      = 256
	maxJobOptions     = 16
	maxJobOptionBytes = 1024
)

// checkJobLabels bounds a job's name, target and options.
func checkJobLabels(a proto.BuildSubmitArgs) error {
	switch {
	case len(a.Name) > maxJobName:
		return fmt.Errorf("job name of %d bytes exceeds the limit of %d: %w", len(a.Name), maxJobName, proto.ErrTooLarge)
	case len(a.Target) > maxJobTarget:
		return fmt.Errorf("target of %d bytes exceeds the limit of %d: %w", len(a.Target), maxJobTarget, proto.ErrTooLarge)
	case len(a.Options) > maxJobOptions:
		return fmt.Errorf("%d build options exceed the limit of %d: %w", len(a.Options), maxJobOptions, proto.ErrTooLarge)
	}
	for k, v := range a.Options {
		if len(k)+len(v) > maxJobOptionBytes {
			return fmt.Errorf("build option %.32q of %d bytes exceeds the limit of %d: %w", k, len(k)+len(v), maxJobOptionBytes, proto.ErrTooLarge)
		}
	}
	return nil
}

func (s *Server) handleBuildSubmit(ctx context.Context, c *proto.Conn, a proto.BuildSubmitArgs) (any, error) {
	if !proto.StoredFormat(a.Format) && len(a.Module) > proto.MaxInlineModule {
		return nil, fmt.Errorf("submit build: module of %d bytes sent inline, over the limit of %d bytes for one frame; send it streamed (%s: the SDK and kiln build do so for every module over that size): %w",
			len(a.Module), proto.MaxInlineModule, proto.BulkBuildSubmit, proto.ErrTooLarge)
	}
	if strings.TrimSpace(a.Module) == "" {
		return nil, fmt.Errorf("submit build: empty module: %w", proto.ErrBadRequest)
	}
	j, err := s.submit(ctx, c, a, int64(len(a.Module)), nil)
	if err != nil {
		return nil, err
	}
	return j, nil
}

// handleBuildSubmitStream is tracker.build.submit with the module on the
// stream: a frame of BuildSubmitArgs, then the module's bytes, which go to
// the module store as they arrive. The job queued goes back as a frame.
func (s *Server) handleBuildSubmitStream(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
	if c.Role() != proto.RoleClient {
		return proto.Bulk{}, fmt.Errorf("submit build: role %s submits no build jobs (a client does): %w", c.Role(), proto.ErrBadRequest)
	}
	b, err := proto.ReadFrame(in.Body, proto.MaxSubmitArgs)
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("submit build: read the submission's arguments at the head of the stream: %w", err)
	}
	var a proto.BuildSubmitArgs
	if err := msgpack.Unmarshal(b, &a); err != nil {
		return proto.Bulk{}, fmt.Errorf("submit build: decode the submission's arguments: %v: %w", err, proto.ErrBadRequest)
	}
	size := in.Size - int64(len(b)) - 4 // the frame's length prefix
	switch {
	case a.Module != "":
		return proto.Bulk{}, fmt.Errorf("submit build: a streamed submission carries its module after its arguments, not in them: %w", proto.ErrBadRequest)
	case proto.StoredFormat(a.Format):
		return proto.Bulk{}, fmt.Errorf("submit build: a %s module is a digest: submit it inline (%s): %w", a.Format, proto.MethodBuildSubmit, proto.ErrBadRequest)
	case size <= 0:
		return proto.Bulk{}, fmt.Errorf("submit build: empty module: %w", proto.ErrBadRequest)
	}
	j, err := s.submit(ctx, c, a, size, in.Body)
	if err != nil {
		return proto.Bulk{}, err
	}
	out, err := msgpack.Marshal(j)
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("submit build: encode the job: %w", err)
	}
	return proto.Bulk{Name: j.ID, Size: int64(len(out)), Body: bytes.NewReader(out)}, nil
}

// submit queues a build job whose module is a.Module (body nil) or the
// size bytes body yields. The module's size is charged against the build
// queue's caps before its first byte is read (see pendingSubmits), so
// that submissions in flight cannot together pass them.
func (s *Server) submit(ctx context.Context, c *proto.Conn, a proto.BuildSubmitArgs, size int64, body io.Reader) (proto.BuildJob, error) {
	if err := s.writable(); err != nil {
		return proto.BuildJob{}, fmt.Errorf("submit build: %w", err)
	}
	switch {
	case proto.TargetKind(a.Target) == "":
		return proto.BuildJob{}, fmt.Errorf("submit build: empty target: %w", proto.ErrBadRequest)
	case size > int64(s.cfg.MaxModuleSize):
		return proto.BuildJob{}, fmt.Errorf("submit build: module of %d bytes exceeds the tracker's limit of %d (--max-module-size): %w", size, s.cfg.MaxModuleSize, proto.ErrTooLarge)
	case a.Format != "" && a.Format != "tvmscript" && a.Format != "onnx-base64" && !proto.StoredFormat(a.Format):
		return proto.BuildJob{}, fmt.Errorf("submit build: unknown module format %q (want tvmscript, onnx-base64, onnx-artifact or tvmscript-artifact): %w", a.Format, proto.ErrBadRequest)
	case proto.StoredFormat(a.Format) && !validSHA256(a.Module):
		return proto.BuildJob{}, fmt.Errorf("submit build: a %s module is the sha256 of a module in the artifact store, not %q: %w", a.Format, a.Module, proto.ErrBadRequest)
	case a.QueueTimeout < 0 || a.RunTimeout < 0:
		return proto.BuildJob{}, fmt.Errorf("submit build: negative timeout: %w", proto.ErrBadRequest)
	case a.QueueTimeout > s.cfg.MaxJobQueueTimeout:
		return proto.BuildJob{}, fmt.Errorf("submit build: queue timeout %s exceeds the tracker's limit of %s (--max-job-queue-timeout): %w", a.QueueTimeout, s.cfg.MaxJobQueueTimeout, proto.ErrBadRequest)
	case a.RunTimeout > s.cfg.MaxJobRunTimeout:
		return proto.BuildJob{}, fmt.Errorf("submit build: run timeout %s exceeds the tracker's limit of %s (--max-job-run-timeout): %w", a.RunTimeout, s.cfg.MaxJobRunTimeout, proto.ErrBadRequest)
	}
	if err := checkJobLabels(a); err != nil {
		return proto.BuildJob{}, fmt.Errorf("submit build: %w", err)
	}
	if err := checkJobPlace(a); err != nil {
		return proto.BuildJob{}, fmt.Errorf("submit build: %w", err)
	}
	if a.QueueTimeout == 0 {
		a.QueueTimeout = s.cfg.JobQueueTimeout
	}
	if a.RunTimeout == 0 {
		a.RunTimeout = s.cfg.JobRunTimeout
	}
	if kind, name := identity(c); kind == "node" {
		return proto.BuildJob{}, fmt.Errorf("submit build: node %q: a node credential submits no build jobs (a client does, with its own token): %w", name, proto.ErrUnauthorized)
	}
	now := time.Now()
	owner := userOf(c)
	s.mu.Lock()
	if proto.StoredFormat(a.Format) && !s.mayReadArtifactLocked(c, a.Module) {
		s.mu.Unlock()
		return proto.BuildJob{}, fmt.Errorf("submit build: %s module %s: %w (upload it first)", a.Format, a.Module, proto.ErrNotFound)
	}
	if a.SubmitKey != "" {
		j, err := s.submittedLocked(ctx, owner, a.SubmitKey)
		if j != nil || err != nil {
			s.mu.Unlock()
			if err != nil {
				return proto.BuildJob{}, err
			}
			return *j, nil
		}
		key := idemKey{owner, a.SubmitKey}
		done := make(chan struct{})
		s.submitting[key] = done
		defer func() {
			s.mu.Lock()
			delete(s.submitting, key)
			close(done)
			s.mu.Unlock()
		}()
	}
	if err := s.queueRoomLocked(owner, size); err != nil {
		s.mu.Unlock()
		return proto.BuildJob{}, err
	}
	// The module's bytes count against the caps from here on, while they
	// arrive and the job's record is written; the job takes the charge
	// over once in s.jobs.
	s.pending.add(owner, size)
	// A streamed module no compiler node can build is not taken: its job
	// fails at once.
	early := s.unbuildableLocked(a.Target)
	if body == nil {
		early = nil
	}
	s.mu.Unlock()
	var key, sum string
	text := a.Module
	inline := proto.StoredFormat(a.Format)
	var err error
	switch {
	case early != nil:
	case !inline && !s.cfg.replicated():
		// The text goes to the module store, not the tracker's memory or
		// its state store.
		r := body
		if r == nil {
			r = strings.NewReader(text)
		}
		key, sum, err = s.putModule(ctx, r, size)
		text = ""
	case !inline && body != nil:
		// A replica's module goes to etcd, which every replica reaches:
		// one record, within MaxModuleSize (at most store.EtcdMaxValue).
		var b strings.Builder
		var n int64
		n, err = io.Copy(&b, io.LimitReader(body, size))
		if err == nil && n != size {
			err = fmt.Errorf("got %d of %d bytes: %w", n, size, io.ErrUnexpectedEOF)
		}
		text = b.String()
		fallthrough
	case !inline:
		h := sha256.Sum256([]byte(text))
		sum = hex.EncodeToString(h[:])
	}
	if err != nil {
		s.mu.Lock()
		s.pending.add(owner, -size)
		s.mu.Unlock()
		return proto.BuildJob{}, fmt.Errorf("submit build: %w", err)
	}
	s.mu.Lock()
	s.nextJob++
	next := s.nextJob
	j := &job{
		BuildJob: proto.BuildJob{
			ID: fmt.Sprintf("j-%08d", next), Name: a.Name, Target: a.Target, Format: a.Format, Options: a.Options, Owner: owner,
			State: proto.JobQueued, Submitted: now, QueueTimeout: a.QueueTimeout, RunTimeout: a.RunTimeout,
		},
		moduleKey: key, moduleSize: size, queuedAt: now, changed: make(chan struct{}),
	}
	if !inline {
		j.ModuleSize, j.ModuleSHA256 = size, sum
	}
	switch {
	case inline:
		j.module = text
	case key == "":
		j.moduleStored = true
	}
	// A job no registered compiler node can build fails at once (it is
	// kept, failed, so that query shows it and the client's wait ends).
	unbuildable := early
	if unbuildable == nil {
		unbuildable = s.unbuildableLocked(a.Target)
	}
	if unbuildable != nil {
		j.State, j.Error, j.Finished = proto.JobFailed, unbuildable.Error(), now
		j.module, j.moduleKey, j.moduleSize, j.moduleStored = "", "", 0, false
	}
	j.SubmitKey = a.SubmitKey
	j.Class, j.Priority, j.CancelOnDisconnect = a.Class, a.Priority, a.CancelOnDisconnect
	adoptLocked(j, c)
	rec := jobRecord{Job: j.BuildJob, QueuedAt: now, ModuleKey: j.moduleKey, ModuleSize: j.moduleSize}
	var changes []store.Change
	if unbuildable == nil && j.moduleStored {
		changes = append(changes, store.Put(store.Modules, rec.Job.ID, text))
	}
	// The job stays counted as pending until it is in s.jobs.
	durable := s.st.Apply(append(changes, store.Put(store.Meta, store.MetaNextJob, next), store.Put(store.Jobs, rec.Job.ID, rec))...)
	s.mu.Unlock()
	if key != "" && unbuildable != nil {
		go s.removeModule(key)
	}
	err = <-durable
	s.mu.Lock()
	s.pending.add(owner, -size)
	if err != nil {
		s.mu.Unlock()
		if key != "" {
			go s.removeModule(key)
		}
		return proto.BuildJob{}, fmt.Errorf("submit build: persist job: %w", err)
	}
	s.jobs[j.ID] = j
	if unbuildable == nil {
		s.queueJobLocked(j)
	}
	out := j.BuildJob
	s.placeLocked(&out)
	s.mu.Unlock()
	if unbuildable != nil {
		s.log.Info("build job failed at submit", "job", j.ID, "name", a.Name, "err", unbuildable)
		return out, nil
	}
	s.log.Info("build job submitted", "job", j.ID, "name", a.Name, "target", a.Target, "module_bytes", size)
	return out, nil
}

// pendingSubmits are the submissions between their check against the
// build queue's caps and their job's place in the queue (their modules
// arriving, their records being written), guarded by Server.mu: they
// count against the caps as queued jobs do.
type pendingSubmits struct {
	jobs    int
	bytes   int64
	byOwner map[string]pendingOwner
}

type pendingOwner struct {
	jobs  int
	bytes int64
}

// add counts a submission of size bytes by owner (size < 0: uncounts one).
func (p *pendingSubmits) add(owner string, size int64) {
	d := 1
	if size < 0 {
		d = -1
	}
	p.jobs += d
	p.bytes += size
	if p.byOwner == nil {
		p.byOwner = map[string]pendingOwner{}
	}
	o := p.byOwner[owner]
	o.jobs += d
	o.bytes += size
	if o.jobs <= 0 {
		delete(p.byOwner, owner)
		return
	}
	p.byOwner[owner] = o
}

// queueRoomLocked refuses a module of size bytes that would pass a cap of
// the build queue: queued jobs and module bytes, the tracker's and the
// named owner's, counting the submissions still arriving.
func (s *Server) queueRoomLocked(owner string, size int64) error {
	queued, queuedBytes := s.pending.jobs, s.pending.bytes
	mine, mineBytes := s.pending.byOwner[owner].jobs, s.pending.byOwner[owner].bytes
	for _, q := range s.jobs {
		if q.State == proto.JobQueued {
			queued++
			queuedBytes += q.moduleSize
			if owner != "" && q.Owner == owner {
				mine++
				mineBytes += q.moduleSize
			}
		}
	}
	switch {
	case owner != "" && mine >= s.cfg.MaxQueuedJobsPerUser:
		return fmt.Errorf("submit build: user %q has %d jobs queued, the limit per user (--max-queued-jobs-per-user); try again when some have been built: %w", owner, mine, proto.ErrBusy)
	case owner != "" && mineBytes+size > s.cfg.MaxQueuedBytesPerUser:
		return fmt.Errorf("submit build: user %q's queued modules hold %d bytes; %d more would pass the limit per user of %d (--max-queued-bytes-per-user); try again when some have been built: %w",
			owner, mineBytes, size, s.cfg.MaxQueuedBytesPerUser, proto.ErrBusy)
	case queued >= s.cfg.MaxQueuedJobs:
		return fmt.Errorf("submit build: %d jobs are queued, the tracker's limit (--max-queued-jobs); try again when some have been built: %w", queued, proto.ErrBusy)
	case queuedBytes+size > s.cfg.MaxQueuedBytes:
		return fmt.Errorf("submit build: the queued modules hold %d bytes; %d more would pass the tracker's limit of %d (--max-queued-bytes); try again when some have been built: %w",
			queuedBytes, size, s.cfg.MaxQueuedBytes, proto.ErrBusy)
	}
	return nil
}

// idemKey is a user's idempotency key (a build submission's SubmitKey, a
// lease request's RequestKey).
type idemKey struct{ owner, key string }

// submittedLocked returns the job the user's submission with key made,
// nil when there is none. A submission with that key still being made is
// waited for (s.mu is released meanwhile).
func (s *Server) submittedLocked(ctx context.Context, owner, key string) (*proto.BuildJob, error) {
	for {
		for _, j := range s.jobs {
			if j.SubmitKey == key && j.Owner == owner {
				out := j.BuildJob
				s.placeLocked(&out)
				return &out, nil
			}
		}
		pending := s.submitting[idemKey{owner, key}]
		if pending == nil {
			return nil, nil
		}
		s.mu.Unlock()
		select {
		case <-pending:
		case <-ctx.Done():
			s.mu.Lock()
			return nil, fmt.Errorf("submit build: %w", ctx.Err())
		}
		s.mu.Lock()
	}
}

func (s *Server) jobLocked(id string) (*job, error) {
	j := s.jobs[id]
	if j == nil {
		return nil, fmt.Errorf("build job %q: %w (finished jobs are kept for %s, --job-retention)", id, proto.ErrNotFound, s.cfg.JobRetention)
	}
	return j, nil
}

func (s *Server) handleBuildStatus(ctx context.Context, c *proto.Conn, a proto.BuildJobArgs) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.jobLocked(a.ID)
	if err != nil {
		return nil, err
	}
	out := jobFor(c, j.BuildJob)
	s.placeLocked(&out)
	return out, nil
}

// userOf is the named user on c ("" for the fleet token, a node or none).
func userOf(c *proto.Conn) string {
	if c == nil {
		return ""
	}
	if kind, name := identity(c); kind == "user" {
		return name
	}
	return ""
}

// ownsJob reports whether the peer on c acts for j's owner: the fleet
// token (an administrator) or the named user who submitted j. A node
// credential owns no job.
func ownsJob(c *proto.Conn, j proto.BuildJob) bool {
	switch kind, name := identity(c); kind {
	case "admin":
		return true
	case "user":
		return name == j.Owner
	}
	return false
}

// seesJob reports whether the peer on c sees all of j: its owner, or the
// compiler node that claimed it. A device credential sees no job whole.
func seesJob(c *proto.Conn, j proto.BuildJob) bool {
	if ownsJob(c, j) {
		return true
	}
	kind, name := identity(c)
	return kind == "node" && c.Role() == proto.RoleCompiler && j.Node == name
}

// jobFor is j as the peer on c may see it: anyone but its owner and the
// compiler node that claimed it sees it without its options, message,
// error, log and artifact.
func jobFor(c *proto.Conn, j proto.BuildJob) proto.BuildJob {
	if seesJob(c, j) {
		return j
	}
	j.Options, j.Message, j.Error, j.Log, j.SubmitKey = nil, "", "", "", ""
	j.Artifact, j.ArtifactSize = "", 0 // an artifact is its job owner's
	return j
}

func (s *Server) handleBuildWait(ctx context.Context, c *proto.Conn, a proto.BuildWaitArgs) (any, error) {
	wait := a.Wait
	if wait <= 0 {
		wait = defaultBuildWait
	}
	timer := time.NewTimer(min(wait, maxBuildWait))
	defer timer.Stop()
	for {
		s.mu.Lock()
		j, err := s.jobLocked(a.ID)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if ownsJob(c, j.BuildJob) {
			adoptLocked(j, c)
		}
		out := jobFor(c, j.BuildJob)
		s.placeLocked(&out)
		if j.Seq > a.Seq || j.State.Final() || a.Position != 0 && out.Position > 0 && out.Position != a.Position {
			s.mu.Unlock()
			return out, nil
		}
		changed := j.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			a.Seq = 0 // answer with the job as it is
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for build job %q: %w", a.ID, ctx.Err())
		}
	}
}

func (s *Server) handleBuildCancel(ctx context.Context, c *proto.Conn, a proto.BuildJobArgs) (any, error) {
	s.mu.Lock()
	j, err := s.jobLocked(a.ID)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if !ownsJob(c, j.BuildJob) {
		s.mu.Unlock()
		return nil, fmt.Errorf("cancel build job %q: it is not %s's; only its owner or a holder of the fleet token may cancel it: %w", a.ID, who(c), proto.ErrUnauthorized)
	}
	if j.State.Final() {
		out := j.BuildJob
		s.mu.Unlock()
		return out, nil
	}
	durable := s.finishJobLocked(j, proto.JobCancelled, "cancelled by the client", time.Now())
	out := j.BuildJob
	s.mu.Unlock()
	if err := <-durable; err != nil {
		return nil, fmt.Errorf("cancel build job %q: %w", a.ID, err)
	}
	s.log.Info("build job cancelled", "job", a.ID)
	return out, nil
}

// finishJobLocked moves j to a final state (without waiting for the store).
// It returns the persist's result channel.
func (s *Server) finishJobLocked(j *job, state proto.JobState, msg string, now time.Time) <-chan error {
	if j.State == proto.JobQueued {
		s.unqueueJobLocked(j)
	}
	if n := s.nodes[j.Node]; n != nil {
		delete(n.jobs, j.ID)
		if len(n.jobs) == 0 {
			s.nodeChangedLocked(n)
		}
	}
	j.State, j.Finished = state, now
	if state == proto.JobFailed || state == proto.JobCancelled {
		j.Error = msg
	}
	return s.changeJobLocked(j)
}

func (s *Server) compilerLocked(id string, c *proto.Conn, what string) (*node, error) {
	if c.Role() != proto.RoleCompiler {
		return nil, fmt.Errorf("%s: only compiler nodes may: %w", what, proto.ErrBadRequest)
	}
	n := s.nodes[id]
	if n == nil || n.role != proto.NodeCompiler || n.conn != c {
		// Only the connection a compiler node registered on speaks for
		// it: another member could otherwise complete its jobs with an
		// artifact of its own.
		return nil, fmt.Errorf("%s: compiler node %q is not registered on this connection (register again): %w", what, id, proto.ErrNotFound)
	}
	return n, nil
}

func (s *Server) handleBuildTake(ctx context.Context, c *proto.Conn, a proto.BuildTakeArgs) (any, error) {
	if err := s.writable(); err != nil {
		return nil, fmt.Errorf("take build job: %w", err)
	}
	wait := a.Wait
	if wait <= 0 {
		wait = defaultBuildWait
	}
	timer := time.NewTimer(min(wait, maxBuildWait))
	defer timer.Stop()
	for {
		s.mu.Lock()
		n, err := s.compilerLocked(a.NodeID, c, "take build job")
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if j := s.pickJobLocked(n); j != nil {
			now := time.Now()
			s.unqueueJobLocked(j)
			j.State, j.Node, j.Started = proto.JobRunning, n.id, now
			j.Attempt++
			j.Progress, j.Message = 0, ""
			n.jobs[j.ID] = j
			s.m.jobQueueWait.Observe(now.Sub(j.queuedAt).Seconds())
			s.changeJobLocked(j)
			s.nodeChangedLocked(n)
			out := j.BuildJob
			out.Module = j.module
			key, size, stored := j.moduleKey, j.moduleSize, j.moduleStored
			s.mu.Unlock()
			// A module over MaxInlineModule stays out of the reply (and of
			// the tracker's memory): the node reads it from BulkBuildModule
			// (a job stored before ModuleSize was its report's has it
			// from its record).
			if key != "" || stored {
				out.ModuleSize = size
			}
			if (key != "" || stored) && size <= proto.MaxInlineModule {
				text, err := s.jobModule(ctx, j.ID, key, size)
				if err != nil {
					s.mu.Lock()
					if j.State == proto.JobRunning && j.Node == n.id {
						s.finishJobLocked(j, proto.JobFailed, fmt.Sprintf("its module could not be read back: %v", err), time.Now())
					}
					s.mu.Unlock()
					s.log.Error("build job's module", "job", j.ID, "err", err)
					return nil, fmt.Errorf("take build job: job %s: %w", j.ID, err)
				}
				out.Module = text
			}
			s.log.Info("build job started", "job", j.ID, "node", n.id, "attempt", j.Attempt)
			return proto.BuildTakeReply{Job: &out}, nil
		}
		avail := s.jobAvail
		s.mu.Unlock()
		select {
		case <-avail:
		case <-timer.C:
			return proto.BuildTakeReply{}, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("take build job: %w", ctx.Err())
		}
	}
}

// pickJobLocked returns the first queued job in hand-out order (see
// jobOrder) whose target n builds (its kind and, for a -mtriple, its
// triple: NodeAttrs.CanBuild).
func (s *Server) pickJobLocked(n *node) *job {
	if n.lost || n.quarantine {
		return nil
	}
	for _, j := range s.queued {
		if n.attrs.CanBuild(j.Target) {
			return j
		}
	}
	return nil
}

// runningJobLocked returns the job id if node runs it, else an error
// wrapping ErrCancelled (the node must stop) or ErrNotFound.
func (s *Server) runningJobLocked(id, nodeID string, c *proto.Conn, what string) (*job, error) {
	if _, err := s.compilerLocked(nodeID, c, what); err != nil {
		return nil, err
	}
	j, err := s.jobLocked(id)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if j.State != proto.JobRunning || j.Node != nodeID {
		return nil, fmt.Errorf("%s: build job %q is %s (node %q), no longer this node's: stop working on it: %w", what, id, j.State, j.Node, proto.ErrCancelled)
	}
	return j, nil
}

func (s *Server) handleBuildProgress(ctx context.Context, c *proto.Conn, a proto.BuildProgressArgs) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.runningJobLocked(a.ID, a.NodeID, c, "build progress")
	if err != nil {
		return nil, err
	}
	j.Progress, j.Message = min(max(a.Fraction, 0), 1), a.Message
	j.Seq++
	notify(&j.changed)
	return nil, nil
}

func (s *Server) handleBuildComplete(ctx context.Context, c *proto.Conn, a proto.BuildCompleteArgs) (any, error) {
	if err := proto.ValidSHA256(a.Artifact); err != nil {
		return nil, fmt.Errorf("complete build job %q: %w", a.ID, err)
	}
	size, err := s.artifactSize(a.Artifact)
	if err != nil {
		return nil, fmt.Errorf("complete build job %q: upload the artifact first: %w", a.ID, err)
	}
	s.mu.Lock()
	j, err := s.runningJobLocked(a.ID, a.NodeID, c, "complete build job")
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if !s.mayReadArtifactLocked(c, a.Artifact) {
		// A node completes a job only with an artifact it uploaded, so
		// that it cannot hand the job's owner somebody else's.
		s.mu.Unlock()
		return nil, fmt.Errorf("complete build job %q: upload the artifact first: artifact %s: %w", a.ID, a.Artifact, proto.ErrNotFound)
	}
	var owned <-chan error
	if rec, ok := s.arti.recs[a.Artifact]; ok && j.Owner != "" {
		rec = rec.withOwner(j.Owner)
		s.arti.add(a.Artifact, rec) // now charged to the job's owner
		owned = s.st.Apply(store.Put(store.Artifacts, a.Artifact, rec))
		s.evictLocked(a.Artifact)
	}
	j.Artifact, j.ArtifactSize, j.Log, j.Progress = a.Artifact, size, a.Log, 1
	durable := s.finishJobLocked(j, proto.JobSucceeded, "", time.Now())
	s.mu.Unlock()
	if owned != nil {
		if err := <-owned; err != nil {
			return nil, fmt.Errorf("complete build job %q: %w", a.ID, err)
		}
	}
	if err := <-durable; err != nil {
		return nil, fmt.Errorf("complete build job %q: %w", a.ID, err)
	}
	s.log.Info("build job succeeded", "job", a.ID, "node", a.NodeID, "artifact", a.Artifact)
	return nil, nil
}

func (s *Server) handleBuildFail(ctx context.Context, c *proto.Conn, a proto.BuildFailArgs) (any, error) {
	s.mu.Lock()
	j, err := s.runningJobLocked(a.ID, a.NodeID, c, "fail build job")
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	msg := a.Message
	if msg == "" {
		msg = "the compiler node gave no message"
	}
	j.Log = a.Log
	durable := s.finishJobLocked(j, proto.JobFailed, msg, time.Now())
	s.mu.Unlock()
	if err := <-durable; err != nil {
		return nil, fmt.Errorf("fail build job %q: %w", a.ID, err)
	}
	s.log.Info("build job failed", "job", a.ID, "node", a.NodeID, "error", msg)
	return nil, nil
}

// requeueNodeJobsLocked puts the jobs running on n back in the queue, or
// fails those out of attempts.
func (s *Server) requeueNodeJobsLocked(n *node, why string) {
	now := time.Now()
	for id, j := range n.jobs {
		delete(n.jobs, id)
		if j.Attempt >= s.cfg.JobMaxAttempts {
			s.finishJobLocked(j, proto.JobFailed, fmt.Sprintf("%s; gave up after %d attempts", why, j.Attempt), now)
			continue
		}
		s.requeueLocked(j, why, now)
	}
}

func (s *Server) requeueLocked(j *job, why string, now time.Time) {
	j.State, j.Node, j.Started, j.Progress = proto.JobQueued, "", time.Time{}, 0
	j.Message = "requeued: " + why
	j.queuedAt = now
	s.log.Warn("build job requeued", "job", j.ID, "why", why)
	s.changeJobLocked(j)
	s.queueJobLocked(j)
}

func (s *Server) expireJobsLocked(now time.Time) {
	for _, j := range s.jobs {
		switch {
		case j.State == proto.JobQueued && now.Sub(j.queuedAt) > j.QueueTimeout:
			s.finishJobLocked(j, proto.JobFailed, fmt.Sprintf("waited %s in the queue, over its queue limit of %s (no compiler node for target %q took it)",
				now.Sub(j.queuedAt).Round(time.Millisecond), j.QueueTimeout, j.Target), now)
		case j.State == proto.JobRunning && now.Sub(j.Started) > j.RunTimeout:
			s.finishJobLocked(j, proto.JobFailed, fmt.Sprintf("ran %s on compiler node %q, over its run limit of %s",
				now.Sub(j.Started).Round(time.Millisecond), j.Node, j.RunTimeout), now)
		case j.State.Final() && now.Sub(finishedAt(j)) > s.cfg.JobRetention:
			s.forgetJobLocked(j)
		}
	}
	s.cancelOrphansLocked(now)
}

// finishedAt is when j ended (when it was queued, for a job stored
// without an end time).
func finishedAt(j *job) time.Time {
	if !j.Finished.IsZero() {
		return j.Finished
	}
	return j.queuedAt
}

// forgetJobLocked removes a finished job past its retention from memory
// and from the store; a status request for it is then answered not found.
func (s *Server) forgetJobLocked(j *job) {
	delete(s.jobs, j.ID)
	notify(&j.changed)
	id := j.ID
	s.st.Apply(store.Delete(store.Modules, id), store.Delete(store.Jobs, id))
	s.log.Info("build job forgotten", "job", id, "state", j.State, "finished", finishedAt(j), "retention", s.cfg.JobRetention)
}

// validSHA256 reports whether s is 64 lowercase hex digits.
func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}
