package cli

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

// TestQueryBuildQueue: with jobs waiting for a busy compiler node, kiln
// query lists the build queue in hand-out order with each job's class,
// position and ETA, and a waiting kiln build --tracker (an interactive
// job) prints its position, ahead of the bulk tuning job queued before it.
func TestQueryBuildQueue(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	check.NoError(t, os.WriteFile(tokFile, []byte("secret\n"), 0o600))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "tracker"), Token: "secret", Logger: quiet})
	check.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	trDone := make(chan error, 1)
	go func() { trDone <- tr.Run(ctx) }()
	defer func() { cancel(); <-trDone }()
	addr := tr.Addr()

	// A compiler node that takes no job: everything stays queued.
	reg := client.NewRegistrar(addr, client.TrackerOptions{Token: "secret", Logger: quiet},
		proto.RegisterArgs{Role: proto.NodeCompiler, Attrs: proto.NodeAttrs{Targets: []string{"cpu"}}})
	rctx, rcancel := context.WithCancel(ctx)
	regDone := make(chan struct{})
	go func() { defer close(regDone); reg.Run(rctx) }()
	defer func() { rcancel(); <-regDone }()
	<-reg.Ready()

	tc, err := client.DialTracker(ctx, addr, client.TrackerOptions{Token: "secret", Logger: quiet})
	check.NoError(t, err)
	defer tc.Close()
	const mod = "@I.ir_module\nclass Module:\n    pass\n"
	_, err = tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "tune-mm-1", Module: mod, Target: "cpu", Class: proto.JobBulk})
	check.NoError(t, err)
	_, err = tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "first.py", Module: mod, Target: "cpu"})
	check.NoError(t, err)

	src := filepath.Join(dir, "mm.py")
	check.NoError(t, os.WriteFile(src, []byte(tuneMatmulPy), 0o644))
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	var errOut syncBuffer
	built := make(chan error, 1)
	go func() {
		app := App()
		app.Writer, app.ErrWriter = io.Discard, &errOut
		built <- Run(bctx, app, []string{"kiln", "build", src, "--tracker", addr, "--token-file", tokFile, "-o", filepath.Join(dir, "mm.kiln")})
	}()
	for !strings.Contains(errOut.String(), "in the build queue") {
		select {
		case err := <-built:
			t.Fatalf("kiln build ended: %v\n%s", err, errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	check.True(t, strings.Contains(errOut.String(), "queued (position 2 in the build queue, ETA -)"), errOut.String())

	out, errQ, err := runApp(t, "query", "--tracker", addr, "--token-file", tokFile)
	check.NoError(t, err, errQ)
	i := strings.Index(out, "build queue")
	check.True(t, i >= 0, out)
	var rows []string
	for _, line := range strings.Split(out[i:], "\n")[2:] {
		if strings.TrimSpace(line) == "" {
			break
		}
		rows = append(rows, strings.Join(strings.Fields(line), " "))
	}
	check.Equal(t, len(rows), 3, out)
	for k, want := range []string{"1 j-00000002 interactive 0 first.py", "2 j-00000003 interactive 0 mm.py", "3 j-00000001 bulk 0 tune-mm-1"} {
		check.True(t, strings.HasPrefix(rows[k], want), "row", k+1, rows[k])
	}
	bcancel()
	check.Error(t, <-built, "canceled")
}
