package tracker

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// blob is n bytes of fill and their sha256.
func blob(fill byte, n int) ([]byte, string) {
	b := bytes.Repeat([]byte{fill}, n)
	h := sha256.Sum256(b)
	return b, hex.EncodeToString(h[:])
}

func upload(t *testing.T, tc *client.Tracker, b []byte, sha string) error {
	t.Helper()
	return tc.UploadArtifact(testCtx(t), sha, int64(len(b)), bytes.NewReader(b))
}

func download(t *testing.T, tc *client.Tracker, sha string) error {
	t.Helper()
	_, err := tc.DownloadArtifact(testCtx(t), sha, io.Discard)
	return err
}

// TestArtifactStoreLimit fills the artifact store past --max-artifact-bytes:
// the least recently used artifact (stored or downloaded) is evicted, an
// upload bigger than the whole store is refused naming the limit and the
// flag, and a restart with a lower limit evicts down to it.
func TestArtifactStoreLimit(t *testing.T) {
	cfg := fastConfig(t)
	cfg.MaxArtifactBytes = 3000
	a := startTracker(t, cfg)
	tc := dialTracker(t, a.Addr())
	var shas []string
	for i, fill := range []byte("ABC") {
		b, sha := blob(fill, 1000)
		check.NoError(t, upload(t, tc, b, sha), "upload", i)
		shas = append(shas, sha)
	}
	A, B, C := shas[0], shas[1], shas[2]
	check.NoError(t, download(t, tc, A)) // A is now used more recently than B and C
	d, D := blob('D', 1000)
	check.NoError(t, upload(t, tc, d, D))

	// B, the least recently used, made room for D.
	eventually(t, "B is evicted", func() bool {
		err := download(t, tc, B)
		return err != nil
	})
	err := download(t, tc, B)
	check.ErrorIs(t, err, proto.ErrNotFound)
	check.Error(t, err, "evicted", "--max-artifact-bytes")
	for _, sha := range []string{A, C, D} {
		check.NoError(t, download(t, tc, sha))
	}
	eventually(t, "B's file is removed", func() bool {
		_, err := os.Stat(filepath.Join(cfg.DataDir, "artifacts", B[:2], B))
		return errors.Is(err, os.ErrNotExist)
	})

	big, bigSHA := blob('E', 4000)
	err = upload(t, tc, big, bigSHA)
	check.ErrorIs(t, err, proto.ErrTooLarge)
	check.Error(t, err, "4000 bytes", "limit of 3000 bytes", "--max-artifact-bytes")

	// A lower limit at restart evicts down to it, least recently used
	// first: A (the downloads above used A, then C, then D).
	a.stop(t)
	cfg.Listen = a.Addr()
	cfg.MaxArtifactBytes = 2000
	b := startTracker(t, cfg)
	tc = dialTracker(t, b.Addr())
	eventually(t, "A is evicted", func() bool { return download(t, tc, A) != nil })
	check.ErrorIs(t, download(t, tc, A), proto.ErrNotFound)
	check.ErrorIs(t, download(t, tc, B), proto.ErrNotFound)
	check.NoError(t, download(t, tc, C))
	check.NoError(t, download(t, tc, D))
}

// TestArtifactErrorsHidePaths breaks the artifact store's spool directory:
// the uploader learns what failed, but not where the tracker keeps its
// data.
func TestArtifactErrorsHidePaths(t *testing.T) {
	cfg := fastConfig(t)
	a := startTracker(t, cfg)
	tmp := filepath.Join(cfg.DataDir, "artifacts", "tmp")
	check.NoError(t, os.RemoveAll(tmp))
	check.NoError(t, os.WriteFile(tmp, nil, 0o600)) // a file where the directory was
	tc := dialTracker(t, a.Addr())
	b, sha := blob('P', 100)
	err := upload(t, tc, b, sha)
	check.Error(t, err, "upload artifact", "not a directory")
	check.True(t, !strings.Contains(err.Error(), cfg.DataDir), "the error shows the tracker's data directory:", err)
}

// TestArtifactsBelongToTheirOwner: an artifact is its job owner's (and
// administrators'): another user does not see its digest in listings, is
// told it is not there when downloading it, cannot become its owner by
// naming it in an upload without its bytes, and cannot build from another
// user's model.
func TestArtifactsBelongToTheirOwner(t *testing.T) {
	cfg := identityConfig(t)
	aliceTok, err := CreateUserToken(cfg.UsersFile, "alice", "client")
	check.NoError(t, err)
	bobTok, err := CreateUserToken(cfg.UsersFile, "bob", "client")
	check.NoError(t, err)
	a := startTracker(t, cfg)
	addr := a.Addr()
	ctx := testCtx(t)
	as := func(tok string) *client.Tracker {
		tc, err := client.DialTracker(ctx, addr, client.TrackerOptions{Token: tok, Logger: quietLogger()})
		check.NoError(t, err)
		t.Cleanup(func() { tc.Close() })
		return tc
	}
	alice, bob, admin := as(aliceTok), as(bobTok), as("fleet")

	cmp, cmpNode := joinedCompiler(t, addr, cfg.UsersFile)
	j, err := alice.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "alice.py", Module: module, Target: "cpu"})
	check.NoError(t, err)
	var took proto.BuildTakeReply
	check.NoError(t, cmp.Call(ctx, proto.MethodBuildTake, proto.BuildTakeArgs{NodeID: cmpNode, Wait: time.Second}, &took))
	check.True(t, took.Job != nil, "the compiler node took no job")
	art := []byte("alice's artifact")
	digest := sha(art)
	check.NoError(t, cmp.Upload(ctx, proto.BulkArtifactUpload, digest, int64(len(art)), bytes.NewReader(art)))
	check.NoError(t, cmp.Call(ctx, proto.MethodBuildComplete, proto.BuildCompleteArgs{ID: j.ID, NodeID: cmpNode, Artifact: digest}, nil))

	download := func(tc *client.Tracker, sha string) (string, error) {
		var buf bytes.Buffer
		_, err := tc.DownloadArtifact(ctx, sha, &buf)
		return buf.String(), err
	}
	got, err := download(alice, digest)
	check.NoError(t, err)
	check.Equal(t, got, string(art))
	got, err = download(admin, digest)
	check.NoError(t, err)
	check.Equal(t, got, string(art))

	// Bob sees alice's job without its artifact.
	st, err := bob.BuildStatus(ctx, j.ID)
	check.NoError(t, err)
	check.Equal(t, st.State, proto.JobSucceeded)
	check.Equal(t, st.Artifact, "")
	sum, err := bob.Query(ctx, 0)
	check.NoError(t, err)
	check.Equal(t, sum.Jobs[0].Artifact, "")
	check.Equal(t, sum.Jobs[0].ArtifactSize, int64(0))

	// Bob's download is refused as if nothing were stored.
	_, err = download(bob, digest)
	check.ErrorIs(t, err, proto.ErrNotFound)
	missing := strings.Repeat("e", 64)
	_, errMissing := download(bob, missing)
	check.Equal(t, strings.ReplaceAll(err.Error(), digest, missing), errMissing.Error())

	// Naming the digest and size in an upload does not make it bob's.
	err = bob.UploadArtifact(ctx, digest, int64(len(art)), bytes.NewReader(make([]byte, len(art))))
	check.ErrorIs(t, err, proto.ErrBadRequest)
	_, err = download(bob, digest)
	check.ErrorIs(t, err, proto.ErrNotFound)

	// Nor may bob build from alice's model, or her stored module.
	for _, f := range []string{"onnx-artifact", "tvmscript-artifact"} {
		model := []byte("alice's " + f)
		check.NoError(t, alice.UploadArtifact(ctx, sha(model), int64(len(model)), bytes.NewReader(model)))
		_, err = bob.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: sha(model), Format: f, Target: "cpu"})
		check.ErrorIs(t, err, proto.ErrNotFound)
		_, err = alice.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: sha(model), Format: f, Target: "cpu"})
		check.NoError(t, err)
		_, err = alice.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: "not a digest", Format: f, Target: "cpu"})
		check.ErrorIs(t, err, proto.ErrBadRequest)
	}

	// Whoever sends the bytes holds them, and may read them back.
	check.NoError(t, bob.UploadArtifact(ctx, digest, int64(len(art)), bytes.NewReader(art)))
	got, err = download(bob, digest)
	check.NoError(t, err)
	check.Equal(t, got, string(art))
}
