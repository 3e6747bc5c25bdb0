package compilernode_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

// fleet is a tracker and one compiler node on loopback; the node keeps a
// secret in a token file of its own and in its environment.
type fleet struct {
	c         *client.Tracker
	secret    string
	tokenFile string
}

func startFleet(t *testing.T, ctx context.Context, mk func(tokenFile string) compilernode.Config) *fleet {
	t.Helper()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	secret := "kiln-secret-" + hex.EncodeToString(b)
	private := t.TempDir()
	tokenFile := filepath.Join(private, "fleet.token")
	check.NoError(t, os.WriteFile(tokenFile, []byte(secret), 0o600))
	t.Setenv("KILN_TEST_NODE_SECRET", secret)

	cfg := mk(tokenFile)
	if cfg.WorkDir == "" {
		cfg.WorkDir = searchable(t)
	}
	c := nodeFleet(t, ctx, tracker.Config{Token: secret}, cfg)
	return &fleet{c: c, secret: secret, tokenFile: tokenFile}
}

// jobBinary is this test binary where a job's uid can run it: as root,
// a copy in a directory every user may search.
func jobBinary(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	check.NoError(t, err)
	if os.Geteuid() != 0 {
		return exe
	}
	dir := searchable(t)
	in, err := os.Open(exe)
	check.NoError(t, err)
	defer in.Close()
	to := filepath.Join(dir, "node.test")
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	check.NoError(t, err)
	_, err = io.Copy(out, in)
	check.NoError(t, err)
	check.NoError(t, out.Close())
	return to
}

// searchable is a fresh directory that every user may search, where the
// job uids of a root node reach what it holds.
func searchable(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kiln-node-attack-")
	check.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	check.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

// TestMaliciousModules: a client submits modules that try to make the C
// compiler read the node's token file (#include, .incbin in __asm__,
// _Pragma, newlines and quotes in names and strings). Each is refused
// naming what was wrong, or builds into an artifact without the secret.
func TestMaliciousModules(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exe := jobBinary(t)
	f := startFleet(t, ctx, func(string) compilernode.Config {
		return compilernode.Config{Command: []string{exe}, JobEnv: []string{"KILN_TEST_NODE_JOB=1"}}
	})
	q := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `"`, `\"`) }
	module := func(stmt string) string {
		return `@T.prim_func
def evil(A: T.Buffer((4,), "float32")):
    T.func_attr({"global_symbol": "evil"})
    for i in range(4):
        ` + stmt + `
        A[i] = T.float32(1)
`
	}
	for _, tc := range []struct{ name, stmt, want string }{
		{"include", `T.evaluate(T.call_extern("int32", "x(); }\n#include \"` + q(f.tokenFile) + `\"\nint y(", 0))`, "must be a C identifier"},
		{"incbin", `T.evaluate(T.call_extern("int32", "__asm__", ".incbin \"` + q(f.tokenFile) + `\""))`, `call_extern of "__asm__" refused`},
		{"pragma", `T.evaluate(T.call_extern("int32", "_Pragma", "GCC dependency \"` + q(f.tokenFile) + `\""))`, `call_extern of "_Pragma" refused`},
		{"quote", `T.evaluate(T.call_extern("int32", "f\"", 0))`, "must be a C identifier"},
		{"newline", `T.evaluate(T.call_extern("int32", "f\n#pragma once", 0))`, "must be a C identifier"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := f.c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "evil.py", Module: module(tc.stmt), Target: "cpu"})
			check.NoError(t, err)
			done, err := f.c.WaitBuild(ctx, job.ID, nil)
			check.ErrorIs(t, err, client.ErrBuildFailed)
			check.Error(t, err, tc.want)
			check.True(t, !strings.Contains(err.Error(), f.secret) && !strings.Contains(done.Log, f.secret), "the secret in the job's error or log", err, done.Log)
		})
	}
	t.Run("string literal", func(t *testing.T) {
		// A message with a quote, a newline and an #include builds: it is
		// one escaped C string, and the artifact has no secret.
		stmt := `assert A[0] == T.float32(0), "x\");\n#include \"` + q(f.tokenFile) + `\"\n__asm__(\".incbin \\\"` + q(f.tokenFile) + `\\\"\");\n"`
		job, err := f.c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "evil.py", Module: module(stmt), Target: "cpu"})
		check.NoError(t, err)
		job, err = f.c.WaitBuild(ctx, job.ID, nil)
		check.NoError(t, err)
		var buf bytes.Buffer
		_, err = f.c.DownloadArtifact(ctx, job.Artifact, &buf)
		check.NoError(t, err)
		a, err := artifact.Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		check.NoError(t, err)
		so := a.Files[artifact.HostLib]
		check.True(t, len(so) > 0, "the artifact has a host library", a.Names())
		check.True(t, bytes.Contains(so, []byte(`#include "`+f.tokenFile+`"`)), "the message is in host.so as text")
		check.True(t, !bytes.Contains(so, []byte(f.secret)), "host.so holds the node's secret")
	})
}

// TestBuildJobSandbox: a build job's process tries to read the node's
// token file and environment; in the sandbox it finds neither.
func TestBuildJobSandbox(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The job command stands for a compromised C compiler: whatever a
	// build runs, it runs as this.
	f := startFleet(t, ctx, func(tokenFile string) compilernode.Config {
		script := `cat "` + tokenFile + `"; env; id; grep CapEff /proc/self/status; exit 1`
		return compilernode.Config{Command: []string{"/bin/sh", "-c", script}, Sandbox: compilernode.SandboxBwrap}
	})
	job, err := f.c.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "v.py", Module: vadd, Target: "cpu"})
	check.NoError(t, err)
	done, err := f.c.WaitBuild(ctx, job.ID, nil)
	check.ErrorIs(t, err, client.ErrBuildFailed)
	t.Logf("job's log: %s", done.Log)
	check.True(t, !strings.Contains(done.Log, f.secret) && !strings.Contains(err.Error(), f.secret), "the job read the node's secret", done.Log)
	check.True(t, strings.Contains(done.Log, "CapEff:\t0000000000000000"), "the job has no capabilities", done.Log)
	if os.Geteuid() == 0 {
		check.True(t, !strings.Contains(done.Log, "uid=0"), "the job runs as root", done.Log)
	}
}
