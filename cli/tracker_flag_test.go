package cli

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

// TestTrackerFlagList: every command's --tracker refuses a list that does
// not parse, naming the entry, and takes several replicas, failing over
// past one nothing listens on.
func TestTrackerFlagList(t *testing.T) {
	for _, cmd := range [][]string{
		{"query"}, {"build", "m.py"}, {"run", "a.kiln"}, {"tune", "m.py"},
		{"rpcserver", "--key", "k"}, {"compiler"},
	} {
		_, _, err := runApp(t, append(cmd, "--tracker", "a:9190,,b:9190")...)
		check.Error(t, err, "--tracker", "entry 2 is empty")
		_, _, err = runApp(t, append(cmd, "--tracker", "trackerhost")...)
		check.Error(t, err, "--tracker", `"trackerhost"`, "HOST:PORT")
	}

	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	check.NoError(t, os.WriteFile(tokFile, []byte("secret\n"), 0o600))
	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "tracker"), Token: "secret",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	defer func() {
		cancel()
		check.NoError(t, <-done)
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	out, _, err := runApp(t, "query", "--tracker", dead+","+tr.Addr(), "--token-file", tokFile, "--json")
	check.NoError(t, err)
	var sum proto.TrackerSummary
	check.NoError(t, json.Unmarshal([]byte(out), &sum))
	check.Equal(t, sum.Leases, 0)
}
