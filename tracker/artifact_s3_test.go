package tracker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// The S3 tests run against a real S3-compatible server started here:
// SeaweedFS's `weed mini` (a master, a volume server, a filer and the S3
// gateway in one process), found as $KILN_WEED or `weed` on PATH. Without
// it they skip, saying how to get it; with KILN_S3_TEST=1 (.ci/run sets it
// after building weed) a missing weed is a failure.

const s3Access, s3Secret = "kilntest", "kilntest-secret-key"

// weedS3 is a running `weed mini` and a client of its S3 gateway.
type weedS3 struct {
	endpoint string // http://127.0.0.1:PORT
	c        *minio.Client
}

// freePortPair returns a loopback port p, free a moment ago, with p+10000
// free too (weed puts each server's gRPC port there).
func freePortPair(t testing.TB) int {
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		check.NoError(t, err)
		p := ln.Addr().(*net.TCPAddr).Port
		if p+10000 > 65535 {
			ln.Close()
			continue
		}
		ln2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		ln.Close()
		if err == nil {
			ln2.Close()
			return p
		}
	}
	t.Fatal("no free loopback port pair")
	return 0
}

func startWeedS3(t testing.TB) *weedS3 {
	t.Helper()
	weed := os.Getenv("KILN_WEED")
	if weed == "" {
		weed, _ = exec.LookPath("weed")
	}
	if weed == "" {
		msg := "no S3-compatible server: set KILN_WEED to a SeaweedFS weed binary or put weed on PATH (.ci/run builds it: go mod download github.com/seaweedfs/seaweedfs@VERSION, then go build ./weed in that module's directory)"
		if os.Getenv("KILN_S3_TEST") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"identities":[{"name":"kiln","credentials":[{"accessKey":%q,"secretKey":%q}],"actions":["Admin","Read","Write","List","Tagging"]}]}`, s3Access, s3Secret)
	check.NoError(t, os.WriteFile(filepath.Join(dir, "s3.json"), []byte(cfg), 0o600))
	s3Port := freePortPair(t)
	args := []string{"mini", "-dir=" + filepath.Join(dir, "data"), "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-s3.config=" + filepath.Join(dir, "s3.json"), "-s3.port=" + strconv.Itoa(s3Port),
		"-master.port=" + strconv.Itoa(freePortPair(t)), "-volume.port=" + strconv.Itoa(freePortPair(t)),
		"-filer.port=" + strconv.Itoa(freePortPair(t)),
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false"}
	check.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o755))
	logf, err := os.Create(filepath.Join(dir, "weed.log"))
	check.NoError(t, err)
	cmd := exec.Command(weed, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	check.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("weed mini log:\n%s", b)
		}
	})
	w := &weedS3{endpoint: "http://127.0.0.1:" + strconv.Itoa(s3Port)}
	w.c, err = minio.New("127.0.0.1:"+strconv.Itoa(s3Port), &minio.Options{Creds: credentials.NewStaticV4(s3Access, s3Secret, "")})
	check.NoError(t, err)
	// Wait until the gateway answers an authenticated request: its
	// startup (master, volume, filer, then S3) takes a while on a loaded
	// machine. The bound is generous; it is not a speed threshold.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = w.c.ListBuckets(ctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case werr := <-exited:
			t.Fatalf("weed mini exited: %v", werr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("weed mini's S3 gateway did not answer: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", s3Access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3Secret)
	return w
}

// bucket makes a bucket and returns its name.
func (w *weedS3) bucket(t testing.TB, name string) string {
	t.Helper()
	check.NoError(t, w.c.MakeBucket(testCtx(t), name, minio.MakeBucketOptions{}))
	return name
}

// has reports whether the bucket holds key.
func (w *weedS3) has(t *testing.T, bucket, key string) bool {
	t.Helper()
	_, err := w.c.StatObject(testCtx(t), bucket, key, minio.StatObjectOptions{})
	if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
		return false
	}
	check.NoError(t, err, "stat", key)
	return true
}

// TestArtifactsS3 keeps a tracker's artifacts in a bucket of a real
// S3-compatible server: uploads land as PREFIX/ab/abcd… objects and
// download byte for byte, a restarted tracker still serves them, a bad
// upload never reaches the bucket, eviction deletes the object, and a
// missing bucket, an unreachable endpoint or a bad URL stop the tracker at
// start naming what is wrong.
func TestArtifactsS3(t *testing.T) {
	w := startWeedS3(t)
	bucket := w.bucket(t, "kiln-artifacts")
	spec := "s3://" + bucket + "/fleet-a?endpoint=" + url.QueryEscape(w.endpoint)

	cfg := fastConfig(t)
	cfg.Artifacts = spec
	cfg.MaxArtifactBytes = 3 << 20
	a := startTracker(t, cfg)
	tc := dialTracker(t, a.Addr())
	one, oneSHA := blob('1', 1<<20+17)
	check.NoError(t, upload(t, tc, one, oneSHA))
	check.True(t, w.has(t, bucket, "fleet-a/"+oneSHA[:2]+"/"+oneSHA), "the artifact is not in the bucket")
	var got bytes.Buffer
	_, err := tc.DownloadArtifact(testCtx(t), oneSHA, &got)
	check.NoError(t, err)
	check.True(t, bytes.Equal(got.Bytes(), one), "downloaded bytes differ")

	// Bytes that do not hash to the name are refused before the bucket.
	bad, badSHA := blob('2', 1000)
	bad[0] = 'x'
	err = upload(t, tc, bad, badSHA)
	check.ErrorIs(t, err, proto.ErrBadRequest)
	check.True(t, !w.has(t, bucket, "fleet-a/"+badSHA[:2]+"/"+badSHA), "a bad upload reached the bucket")

	// A restart keeps serving from the bucket.
	a.stop(t)
	cfg.Listen = a.Addr()
	b := startTracker(t, cfg)
	tc = dialTracker(t, b.Addr())
	got.Reset()
	_, err = tc.DownloadArtifact(testCtx(t), oneSHA, &got)
	check.NoError(t, err)
	check.True(t, bytes.Equal(got.Bytes(), one), "downloaded bytes differ after a restart")

	// Filling the store evicts the least recently used: its object goes.
	for _, fill := range []byte("345") {
		d, sha := blob(fill, 1<<20)
		check.NoError(t, upload(t, tc, d, sha))
	}
	eventually(t, "the evicted artifact's object is deleted", func() bool {
		return !w.has(t, bucket, "fleet-a/"+oneSHA[:2]+"/"+oneSHA)
	})
	check.ErrorIs(t, download(t, tc, oneSHA), proto.ErrNotFound)

	// Bad stores stop the tracker at start, naming what is wrong.
	for _, tt := range []struct{ spec, want string }{
		{"s3://no-such-bucket?endpoint=" + url.QueryEscape(w.endpoint), `bucket "no-such-bucket" does not exist`},
		{"s3://" + bucket + "?endpoint=http://127.0.0.1:1", "reach http://127.0.0.1:1"},
		{"s3://" + bucket + "?endpoint=" + url.QueryEscape(w.endpoint) + "&bucket=x", `unknown parameter "bucket"`},
		{"s3://?endpoint=" + url.QueryEscape(w.endpoint), "no bucket"},
		{"s3://" + bucket + "?endpoint=ftp://h", "want http://HOST:PORT"},
		{"gs://" + bucket, "unknown scheme"},
	} {
		c := fastConfig(t)
		c.Artifacts = tt.spec
		_, err := New(c)
		check.Error(t, err, tt.want)
	}
}

// BenchmarkArtifactStores uploads and downloads 4 MiB artifacts through
// two trackers in the same run, one keeping them in a directory and one in
// an S3 bucket (weed mini on loopback), and reports each one's throughput
// (upload plus download, MB/s) and the bucket's time over the directory's.
func BenchmarkArtifactStores(b *testing.B) {
	w := startWeedS3(b)
	bucket := w.bucket(b, "kiln-bench")
	dirCfg, s3Cfg := fastConfig(b), fastConfig(b)
	s3Cfg.Artifacts = "s3://" + bucket + "?endpoint=" + url.QueryEscape(w.endpoint)
	stores := []struct {
		name string
		tc   *client.Tracker
		took time.Duration
	}{{name: "dir", tc: dialTracker(b, startTracker(b, dirCfg).Addr())}, {name: "s3", tc: dialTracker(b, startTracker(b, s3Cfg).Addr())}}
	const size = 4 << 20
	data := make([]byte, size)
	for i := range b.N {
		for j := range stores {
			st := &stores[j]
			binary.LittleEndian.PutUint64(data, uint64(i*len(stores)+j)) // new content, so a new artifact
			sum := sha256.Sum256(data)
			sha := hex.EncodeToString(sum[:])
			start := time.Now()
			check.NoError(b, st.tc.UploadArtifact(testCtx(b), sha, size, bytes.NewReader(data)))
			n, err := st.tc.DownloadArtifact(testCtx(b), sha, io.Discard)
			check.NoError(b, err)
			check.Equal(b, n, int64(size))
			st.took += time.Since(start)
		}
	}
	for _, st := range stores {
		b.ReportMetric(float64(2*size*b.N)/1e6/st.took.Seconds(), st.name+"-MB/s")
	}
	b.ReportMetric(stores[1].took.Seconds()/stores[0].took.Seconds(), "s3/dir")
}
