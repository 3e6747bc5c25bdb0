package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// buildTracker is a tracker whose one build job succeeds with an
// artifact named sha whose download serves body.
func buildTracker(t *testing.T, sha string, body []byte) string {
	return fakeTracker(t, func(s *proto.Server) {
		s.Handle(proto.MethodBuildSubmit, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			return proto.BuildJob{ID: "j1", State: proto.JobQueued}, nil
		})
		s.Handle(proto.MethodBuildWait, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			return proto.BuildJob{ID: "j1", State: proto.JobSucceeded, Seq: 2, Artifact: sha, ArtifactSize: int64(len(body))}, nil
		})
		s.HandleBulk(proto.BulkArtifactDownload, func(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
			return proto.Bulk{Name: in.Name, Size: int64(len(body)), Body: bytes.NewReader(body)}, nil
		})
	})
}

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestBuildChecksTheArtifact: Build refuses an artifact whose bytes do not
// hash to the sha256 the job names (a tracker or store that hands back
// other bytes), and bytes that hash right but are no kiln artifact.
func TestBuildChecksTheArtifact(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, sha string
		body      []byte
		want      string
	}{
		{"other bytes", hexSHA([]byte("what was built")), []byte("something else"), "does not match its sha256"},
		{"not an artifact", hexSHA([]byte("not an artifact")), []byte("not an artifact"), "downloaded artifact"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := DialTracker(ctx, buildTracker(t, tc.sha, tc.body), TrackerOptions{Logger: quiet()})
			check.NoError(t, err)
			defer tr.Close()
			submitted := ""
			_, art, err := tr.Build(ctx, proto.BuildSubmitArgs{Name: "m.py", Module: "x", Target: "cpu"},
				func(j proto.BuildJob) { submitted = j.ID }, nil)
			check.Error(t, err, tc.want)
			check.True(t, art == nil, "no artifact")
			check.Equal(t, submitted, "j1")
			if tc.name == "other bytes" {
				check.True(t, errors.Is(err, ErrArtifactMismatch), err)
			}
		})
	}
}

// TestBuildCancelsWhenContextEnds: a Build whose context ends while the
// job runs cancels the job at the tracker.
func TestBuildCancelsWhenContextEnds(t *testing.T) {
	var mu sync.Mutex
	var cancelled []string
	waiting := make(chan struct{}, 1)
	addr := fakeTracker(t, func(s *proto.Server) {
		s.Handle(proto.MethodBuildSubmit, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			return proto.BuildJob{ID: "j7", State: proto.JobQueued}, nil
		})
		s.Handle(proto.MethodBuildWait, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			select {
			case waiting <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return nil, ctx.Err()
		})
		s.Handle(proto.MethodBuildCancel, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
			var a proto.BuildJobArgs
			check.NoError(t, msgpack.Unmarshal(raw, &a))
			mu.Lock()
			cancelled = append(cancelled, a.ID)
			mu.Unlock()
			return proto.BuildJob{ID: a.ID, State: proto.JobCancelled}, nil
		})
	})
	tr, err := DialTracker(context.Background(), addr, TrackerOptions{Logger: quiet()})
	check.NoError(t, err)
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-waiting
		cancel()
	}()
	_, _, err = tr.Build(ctx, proto.BuildSubmitArgs{Name: "m.py", Module: "x", Target: "cpu"}, nil, nil)
	check.True(t, err != nil && ctx.Err() != nil, err)
	mu.Lock()
	defer mu.Unlock()
	check.Equal(t, len(cancelled), 1)
	check.Equal(t, cancelled[0], "j7")
}
