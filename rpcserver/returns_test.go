package rpcserver_test

import (
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
)

// TestRemoteFunctionResult builds TVM's zero-argument RPC test functions
// (-> T.int64, return 42), loads the artifact in a session of a daemon
// and calls them: the daemon's worker returns each function's result to
// the client over the wire.
func TestRemoteFunctionResult(t *testing.T) {
	m, err := script.Parse("zero_args.py", `@I.ir_module
class Module:
    @T.prim_func
    def func_without_arg() -> T.int64:
        return T.int64(42)

    @T.prim_func
    def func_with_arg(unused: T.int64) -> T.int64:
        return unused + T.int64(42)

    @T.prim_func
    def half(x: T.float64) -> T.float64:
        return x * T.float64(0.5)
`)
	check.NoError(t, err)
	ctx := testCtx(t)
	a, err := compiler.Build(ctx, m, compiler.MustParseTarget("cpu"), compiler.BuildOptions{})
	check.NoError(t, err)
	b, err := a.Bytes()
	check.NoError(t, err)

	td := startDaemon(t, rpcserver.Config{})
	s := td.connect(t, client.SessionOptions{})
	check.NoError(t, s.Upload(ctx, "zero_args.kiln", b))
	mod, err := s.LoadModule(ctx, "zero_args.kiln")
	check.NoError(t, err)
	for _, tc := range []struct {
		fn   string
		args []any
		want any
	}{
		{"func_without_arg", nil, int64(42)},
		{"func_with_arg", []any{int64(0)}, int64(42)},
		{"func_with_arg", []any{int64(8)}, int64(50)},
		{"half", []any{3.0}, 1.5},
	} {
		f, err := mod.GetFunction(ctx, tc.fn)
		check.NoError(t, err, tc.fn)
		got, err := f.Call(ctx, tc.args...)
		check.NoError(t, err, tc.fn)
		check.Equal(t, got, tc.want, tc.fn)
	}
}
