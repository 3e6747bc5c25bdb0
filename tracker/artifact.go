package tracker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// artifactRecord is an artifact index entry.
type artifactRecord struct {
	Size    int64     `msgpack:"size"`
	Created time.Time `msgpack:"created"`
	// Used is when it was last stored or downloaded (zero in records
	// written before it existed: Created stands in).
	Used time.Time `msgpack:"used,omitempty"`
	// Owners are the identities besides administrators that may download
	// it: the named users who uploaded it or whose job built it, and
	// "node:ID" for a compiler node that uploaded it. Records written
	// before it existed have none: administrators, and users whose kept
	// jobs built it, still read them.
	Owners []string `msgpack:"owners,omitempty"`
}

// artifactOwner is the name c's identity takes in an artifact's Owners
// ("" for an administrator, who needs none).
func artifactOwner(c *proto.Conn) string {
	switch kind, name := identity(c); kind {
	case "user":
		return name
	case "node":
		return nodePrefix + name
	}
	return ""
}

// withOwner returns rec with owner among its Owners.
func (rec artifactRecord) withOwner(owner string) artifactRecord {
	if owner != "" && !slices.Contains(rec.Owners, owner) {
		rec.Owners = append(slices.Clone(rec.Owners), owner)
	}
	return rec
}

// mayReadArtifactLocked reports whether the peer on c may download sha: an
// administrator; a user or node among its owners; a user whose job built
// it; the compiler node running the job whose model it is. Anyone else is
// told it is not there.
func (s *Server) mayReadArtifactLocked(c *proto.Conn, sha string) bool {
	kind, name := identity(c)
	if kind == "admin" {
		return true
	}
	if slices.Contains(s.arti.recs[sha].Owners, artifactOwner(c)) {
		return true
	}
	for _, j := range s.jobs {
		switch {
		case kind == "user" && j.Owner == name && (j.Artifact == sha || proto.StoredFormat(j.Format) && j.module == sha):
			return true
		case kind == "node" && j.State == proto.JobRunning && j.Node == name && proto.StoredFormat(j.Format) && j.module == sha:
			return true
		}
	}
	return false
}

// artIndex is the artifact store's accounting, guarded by Server.mu: each
// artifact's size and last use, for the least-recently-used eviction that
// keeps the store within MaxArtifactBytes, and the bytes charged to each
// owner (stored, and uploads in flight), for their shares of it.
type artIndex struct {
	recs    map[string]artifactRecord
	bytes   int64
	byOwner map[string]int64 // stored bytes by charge (see charge)
	// inflight and inflightBy are the bytes of uploads being received.
	inflight   int64
	inflightBy map[string]int64
}

// charge is the owner an artifact's bytes count against: its first named
// user (a compiler node's upload counts against the user whose job it
// built, once the job is done), else its first owner, else "" (an
// administrator's, or a record from before artifacts had owners).
func (rec artifactRecord) charge() string {
	for _, o := range rec.Owners {
		if !strings.HasPrefix(o, nodePrefix) {
			return o
		}
	}
	if len(rec.Owners) > 0 {
		return rec.Owners[0]
	}
	return ""
}

func (x *artIndex) add(sha string, rec artifactRecord) {
	x.remove(sha)
	if x.recs == nil {
		x.recs = map[string]artifactRecord{}
		x.byOwner = map[string]int64{}
	}
	x.recs[sha] = rec
	x.bytes += rec.Size
	x.byOwner[rec.charge()] += rec.Size
}

func (x *artIndex) remove(sha string) {
	if old, ok := x.recs[sha]; ok {
		x.bytes -= old.Size
		o := old.charge()
		if x.byOwner[o] -= old.Size; x.byOwner[o] <= 0 {
			delete(x.byOwner, o)
		}
		delete(x.recs, sha)
	}
}

// lastUse is when rec was last stored or downloaded.
func (rec artifactRecord) lastUse() time.Time {
	if rec.Used.IsZero() {
		return rec.Created
	}
	return rec.Used
}

// reserveUploadLocked counts an upload of size bytes by owner against the
// store and the owner's share before its first byte is received, so that
// uploads in flight cannot hold more than the store takes; release gives
// the reservation back.
func (s *Server) reserveUploadLocked(sha, owner string, size int64) (release func(), err error) {
	x := &s.arti
	switch {
	case owner != "" && size > s.cfg.MaxArtifactBytesPerUser:
		return nil, fmt.Errorf("upload artifact %s: %d bytes is over one owner's share of the artifact store, %d bytes (--max-artifact-bytes-per-user): %w",
			sha, size, s.cfg.MaxArtifactBytesPerUser, proto.ErrTooLarge)
	case x.inflight+size > s.cfg.MaxArtifactBytes:
		return nil, fmt.Errorf("upload artifact %s: uploads in flight hold %d bytes; %d more would pass the artifact store's limit of %d bytes (--max-artifact-bytes); try again: %w",
			sha, x.inflight, size, s.cfg.MaxArtifactBytes, proto.ErrBusy)
	case owner != "" && x.inflightBy[owner]+size > s.cfg.MaxArtifactBytesPerUser:
		return nil, fmt.Errorf("upload artifact %s: %q's uploads in flight hold %d bytes; %d more would pass one owner's share of %d bytes (--max-artifact-bytes-per-user); try again when they are done: %w",
			sha, owner, x.inflightBy[owner], size, s.cfg.MaxArtifactBytesPerUser, proto.ErrBusy)
	}
	if x.inflightBy == nil {
		x.inflightBy = map[string]int64{}
	}
	x.inflight += size
	x.inflightBy[owner] += size
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		x.inflight -= size
		if x.inflightBy[owner] -= size; x.inflightBy[owner] <= 0 {
			delete(x.inflightBy, owner)
		}
	}, nil
}

// evictLocked evicts least-recently-used artifacts other than keep: an
// owner's own past their share (MaxArtifactBytesPerUser), then, while
// the store holds more than MaxArtifactBytes, those of owners that hold
// more than an equal share of it (one owner's uploads never evict an
// artifact of an owner within theirs). Their index entries go in one
// write; their files are removed once it is durable.
func (s *Server) evictLocked(keep string) {
	shas := make([]string, 0, len(s.arti.recs))
	for sha := range s.arti.recs {
		if sha != keep {
			shas = append(shas, sha)
		}
	}
	slices.SortFunc(shas, func(a, b string) int {
		return s.arti.recs[a].lastUse().Compare(s.arti.recs[b].lastUse())
	})
	var gone []string
	evict := func(sha, why string) {
		rec := s.arti.recs[sha]
		s.log.Info("artifact evicted", "sha256", sha, "size", rec.Size, "owner", rec.charge(), "last_used", rec.lastUse(), "why", why,
			"store_bytes", s.arti.bytes, "limit", s.cfg.MaxArtifactBytes, "owner_bytes", s.arti.byOwner[rec.charge()], "owner_limit", s.cfg.MaxArtifactBytesPerUser)
		s.arti.remove(sha)
		gone = append(gone, sha)
	}
	for _, sha := range shas {
		if o := s.arti.recs[sha].charge(); o != "" && s.arti.byOwner[o] > s.cfg.MaxArtifactBytesPerUser {
			evict(sha, "its owner's share is full")
		}
	}
	for _, sha := range shas {
		if s.arti.bytes <= s.cfg.MaxArtifactBytes {
			break
		}
		rec, ok := s.arti.recs[sha]
		if !ok {
			continue
		}
		if fair := s.cfg.MaxArtifactBytes / int64(max(1, len(s.arti.byOwner))); s.arti.byOwner[rec.charge()] > fair {
			evict(sha, "the store is full and its owner holds more than an equal share")
		}
	}
	if len(gone) == 0 {
		return
	}
	dels := make([]store.Change, len(gone))
	for i, sha := range gone {
		dels[i] = store.Delete(store.Artifacts, sha)
	}
	durable := s.st.Apply(dels...)
	go func() {
		if err := <-durable; err != nil {
			s.log.Error("evict artifacts: index", "err", err)
			return
		}
		for _, sha := range gone {
			// A bucket that does not answer costs this sweep, not forever.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := s.blobs.remove(ctx, sha); err != nil {
				s.log.Warn("evict artifact", "sha256", sha, "err", err)
			}
			cancel()
		}
	}()
}

// touchArtifactLocked records a download of sha as its last use.
func (s *Server) touchArtifactLocked(sha string, now time.Time) {
	rec, ok := s.arti.recs[sha]
	if !ok {
		return
	}
	rec.Used = now
	s.arti.recs[sha] = rec
	s.st.Apply(store.Put(store.Artifacts, sha, rec))
}

// hidePaths returns err as a peer may see it: a file operation's error
// without the tracker's paths (which the log keeps).
func (s *Server) hidePaths(err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		s.log.Error("artifact store", "err", err)
		return fmt.Errorf("artifact store: %s: %w", pe.Op, pe.Err)
	case errors.As(err, &le):
		s.log.Error("artifact store", "err", err)
		return fmt.Errorf("artifact store: %s: %w", le.Op, le.Err)
	}
	return err
}

// artifactSize returns the size of a stored artifact, or an error wrapping
// ErrNotFound.
func (s *Server) artifactSize(sha string) (int64, error) {
	rec, found, err := s.storedArtifact(sha)
	if err != nil {
		return 0, fmt.Errorf("artifact %s: read index: %w", sha, err)
	}
	if !found {
		return 0, fmt.Errorf("artifact %s: %w", sha, proto.ErrNotFound)
	}
	return rec.Size, nil
}

// handleArtifactUpload stores the uploaded bytes under their sha256,
// checking that the name is that hash.
func (s *Server) handleArtifactUpload(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
	if c.Role() != proto.RoleCompiler && c.Role() != proto.RoleClient {
		return proto.Bulk{}, fmt.Errorf("upload artifact: role %s may not upload: %w", c.Role(), proto.ErrBadRequest)
	}
	if err := proto.ValidSHA256(in.Name); err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact: %w", err)
	}
	if in.Size > s.cfg.MaxArtifactBytes {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: %d bytes is over the artifact store's limit of %d bytes (--max-artifact-bytes): %w",
			in.Name, in.Size, s.cfg.MaxArtifactBytes, proto.ErrTooLarge)
	}
	s.mu.Lock()
	mine := s.mayReadArtifactLocked(c, in.Name)
	s.mu.Unlock()
	if size, err := s.artifactSize(in.Name); err == nil && size == in.Size && mine {
		return proto.Bulk{}, nil // already stored, and the uploader may read it
	}
	// Anyone else proves they hold the bytes by sending them: naming a
	// digest is not enough to become one of its owners.
	s.mu.Lock()
	release, err := s.reserveUploadLocked(in.Name, artifactOwner(c), in.Size)
	s.mu.Unlock()
	if err != nil {
		return proto.Bulk{}, err
	}
	defer release()
	tmp, err := os.CreateTemp(s.blobs.spoolDir(), "upload-*")
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: %w", in.Name, s.hidePaths(err))
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name()) // gone already once put renamed it
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(in.Body, in.Size))
	if err == nil && n != in.Size {
		err = fmt.Errorf("got %d of %d bytes: %w", n, in.Size, io.ErrUnexpectedEOF)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: %w", in.Name, s.hidePaths(err))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != in.Name {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: the bytes hash to %s: %w", in.Name, got, proto.ErrBadRequest)
	}
	if err := s.blobs.put(ctx, in.Name, tmp, in.Size); err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: %w", in.Name, s.hidePaths(err))
	}
	now := time.Now()
	name := in.Name
	s.mu.Lock()
	rec := artifactRecord{Size: in.Size, Created: now, Used: now}
	if old, ok := s.arti.recs[name]; ok && old.Size == in.Size {
		rec.Created, rec.Owners = old.Created, old.Owners
	}
	rec = rec.withOwner(artifactOwner(c))
	durable := s.st.Apply(store.Put(store.Artifacts, name, rec))
	s.arti.add(name, rec)
	s.evictLocked(name)
	s.mu.Unlock()
	if err := <-durable; err != nil {
		return proto.Bulk{}, fmt.Errorf("upload artifact %s: index: %w", in.Name, err)
	}
	s.log.Info("artifact stored", "sha256", in.Name, "size", in.Size)
	return proto.Bulk{}, nil
}

func (s *Server) handleArtifactDownload(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
	if err := proto.ValidSHA256(in.Name); err != nil {
		return proto.Bulk{}, fmt.Errorf("download artifact: %w", err)
	}
	size, err := s.artifactSize(in.Name)
	s.mu.Lock()
	if err == nil && !s.mayReadArtifactLocked(c, in.Name) {
		// Another user's artifact is not there for this peer, in the
		// very words of one that is missing.
		err = fmt.Errorf("artifact %s: %w", in.Name, proto.ErrNotFound)
	}
	s.mu.Unlock()
	if errors.Is(err, proto.ErrNotFound) {
		return proto.Bulk{}, fmt.Errorf("download artifact: %w (never stored, or evicted as least recently used to keep the store within --max-artifact-bytes, %d bytes)", err, s.cfg.MaxArtifactBytes)
	}
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("download artifact: %w", err)
	}
	f, err := s.blobs.open(ctx, in.Name)
	if err == nil {
		s.mu.Lock()
		s.touchArtifactLocked(in.Name, time.Now())
		s.mu.Unlock()
	}
	if errors.Is(err, os.ErrNotExist) {
		return proto.Bulk{}, fmt.Errorf("download artifact %s: indexed but missing from the artifact store: %w", in.Name, proto.ErrNotFound)
	}
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("download artifact %s: %w", in.Name, s.hidePaths(err))
	}
	return proto.Bulk{Name: in.Name, Size: size, Body: f}, nil
}
