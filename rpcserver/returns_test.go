package rpcserver_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
)

// TestRemoteFunctionResult builds compiler/testdata/returns.py (TVM's
// zero-argument RPC test functions, -> T.int64 and return 42, and others
// with a result), loads the artifact in a session of a daemon
// and calls them: the daemon's worker returns each function's result to
// the client over the wire.
func TestRemoteFunctionResult(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "compiler", "testdata", "returns.py"))
	check.NoError(t, err)
	m, err := script.Parse("returns.py", string(src))
	check.NoError(t, err)
	ctx := testCtx(t)
	a, err := compiler.Build(ctx, m, compiler.MustParseTarget("cpu"), compiler.BuildOptions{})
	check.NoError(t, err)
	b, err := a.Bytes()
	check.NoError(t, err)

	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	check.NoError(t, s.Upload(ctx, "returns.kiln", b))
	mod, err := s.LoadModule(ctx, "returns.kiln")
	check.NoError(t, err)
	for _, tc := range []struct {
		fn   string
		args []any
		want any
	}{
		{"func_without_arg", nil, int64(42)},
		{"func_with_arg", []any{int64(0)}, int64(42)},
		{"func_with_arg", []any{int64(8)}, int64(42)},
		{"half", []any{3.0}, 1.5},
		{"positive", []any{int64(-2)}, int64(0)},
		{"maybe", []any{int64(21)}, int64(42)},
		{"maybe", []any{int64(-1)}, nil},
	} {
		f, err := mod.GetFunction(ctx, tc.fn)
		check.NoError(t, err, tc.fn)
		got, err := f.Call(ctx, tc.args...)
		check.NoError(t, err, tc.fn)
		check.Equal(t, got, tc.want, tc.fn)
	}
}
