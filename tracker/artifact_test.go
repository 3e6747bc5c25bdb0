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
