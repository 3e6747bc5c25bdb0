package rpcserver_test

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/globals"
)

// TVM's testing globals and random_fill are served by every session; a
// board's plugin adds its functions as globals.
func TestSessionGlobalsAndPlugins(t *testing.T) {
	plugin := filepath.Join(t.TempDir(), "plugin.so")
	check.NoError(t, os.WriteFile(plugin, kernels(t), 0o600))
	td := startDaemon(t, rpcserver.Config{Plugins: []string{plugin}})
	s := td.connect(t, client.SessionOptions{})
	ctx := testCtx(t)

	call := func(name string, args ...any) any {
		t.Helper()
		f, err := s.GetGlobal(ctx, name)
		check.NoError(t, err, name)
		v, err := f.Call(ctx, args...)
		check.NoError(t, err, name)
		return v
	}
	check.Equal(t, call(globals.AddOne, int64(10)), any(int64(11)))
	check.Equal(t, call(globals.StrCat, "abc", int64(11)), any("abc:11"))
	check.Equal(t, call(globals.Echo, "xyz", int64(2)), any("xyz"))
	shape := call(globals.MakeShape, int64(2), int64(3))
	check.Equal(t, call(globals.ShapeElem, shape, int64(1)), any(int64(3)))
	check.Equal(t, call(globals.ShapeSize, shape), any(int64(2)))

	fadd, ok := call(globals.AddToLHS, int64(10)).(*client.Func)
	check.True(t, ok, "add_to_lhs returns a function")
	v, err := fadd.Call(ctx, int64(12))
	check.NoError(t, err)
	check.Equal(t, v, any(int64(22)))

	f, err := s.GetGlobal(ctx, globals.Except)
	check.NoError(t, err)
	_, err = f.Call(ctx, "abc")
	check.Error(t, err, "ValueError: abc")

	// random_fill runs in the worker: the values are drawn there.
	a, err := s.Empty(ctx, ndarray.Shape{64}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	call(globals.RandomFillMeas, a)
	got, err := s.CopyTo(ctx, a)
	check.NoError(t, err)
	b, err := got.Bytes()
	check.NoError(t, err)
	for i := 0; i < 64; i++ {
		x := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		check.True(t, x >= 1 && x < 10, "element", i, x)
	}

	// The plugin's functions are globals of the session.
	x, err := s.Empty(ctx, ndarray.Shape{4}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	y, err := s.Empty(ctx, ndarray.Shape{4}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	check.NoError(t, x.CopyFromBytes(ctx, f32bytes(1, 2, 3, 4)))
	call("vadd", x, x, y)
	out, err := y.ReadBytes(ctx)
	check.NoError(t, err)
	check.Equal(t, out, f32bytes(2, 4, 6, 8))

	// f_preproc names a global run before each repeat.
	vadd, err := s.GetGlobal(ctx, "vadd")
	check.NoError(t, err)
	r, err := s.TimeEvaluator(ctx, vadd, client.TimeOptions{Number: 2, Repeat: 2, Preproc: globals.CacheFlushNonFA}, x, x, y)
	check.NoError(t, err)
	check.Equal(t, len(r.Results), 2)
	_, err = s.TimeEvaluator(ctx, vadd, client.TimeOptions{Number: 1, Repeat: 1, Preproc: "no.such.preproc"}, x, x, y)
	check.Error(t, err, "no.such.preproc")
}

func TestPluginMustBeASharedObject(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "plugin.so")
	check.NoError(t, os.WriteFile(bad, []byte("not elf"), 0o600))
	_, err := rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Dir: t.TempDir(), Plugins: []string{bad}})
	check.Error(t, err, "plugin", "not a shared object")
}

func f32bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
