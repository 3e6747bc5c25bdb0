package load

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/hostcpu"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

const onnxTestdata = "../compiler/frontend/onnx/testdata"

// smallCNN builds the ONNX test model (weights bundled) once.
var smallCNN = sync.OnceValues(func() (*artifact.Artifact, error) {
	mod, weights, err := onnx.ImportFile(filepath.Join(onnxTestdata, "smallcnn.onnx"), onnx.Options{InputShapes: map[string][]int64{"x": {2, 3, 16, 16}}})
	if err != nil {
		return nil, err
	}
	res, err := compiler.Build(context.Background(), mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{Params: weights})
	if err != nil {
		return nil, err
	}
	return res, nil
})

func buildSmallCNN(t *testing.T) *artifact.Artifact {
	t.Helper()
	a, err := smallCNN()
	check.NoError(t, err, "build the ONNX test model")
	return a
}

// loadSmallCNN loads the ONNX test model (closed when the test ends) and
// reads its input.
func loadSmallCNN(t *testing.T) (*Module, *ndarray.NDArray) {
	t.Helper()
	m, err := Artifact(buildSmallCNN(t), Options{})
	check.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	x, err := ndarray.LoadNPY(filepath.Join(onnxTestdata, "smallcnn_x.npy"))
	check.NoError(t, err)
	return m, x
}

// checkSmallCNN compares out with the output numpy computed when the model
// was written.
func checkSmallCNN(t *testing.T, out *ndarray.NDArray) {
	t.Helper()
	wantArr, err := ndarray.LoadNPY(filepath.Join(onnxTestdata, "smallcnn_y.npy"))
	check.NoError(t, err)
	want, err := ndarray.ToSlice[float32](wantArr)
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](out)
	check.NoError(t, err)
	check.Equal(t, len(got), len(want))
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
			t.Fatalf("output %d = %g, want %g", i, got[i], want[i])
		}
	}
}

// TestArtifactBindsBundledWeights: a graph artifact with bundled weights
// runs with its input alone, through GetFunction and Invoke, and gives the
// model's output; given every parameter it runs as well.
func TestArtifactBindsBundledWeights(t *testing.T) {
	m, x := loadSmallCNN(t)
	check.Equal(t, m.Type(), "vm")
	in, err := m.Inputs("main")
	check.NoError(t, err)
	check.Equal(t, in, []string{"x"})

	f, err := m.GetFunction("main")
	check.NoError(t, err)
	res, err := f.Call(packedfunc.Array(x))
	check.NoError(t, err)
	out, err := res.AsArray()
	check.NoError(t, err)
	checkSmallCNN(t, out)

	v, err := m.Invoke("main", packedfunc.Array(x))
	check.NoError(t, err)
	out, err = v.Array()
	check.NoError(t, err)
	checkSmallCNN(t, out)

	// Every parameter given: the weights passed are used.
	info, _ := m.VM().Executable().Function("main")
	all := []packedfunc.Value{packedfunc.Array(x)}
	for _, p := range info.Params[1:] {
		all = append(all, packedfunc.Array(m.Weights()[p.Name]))
	}
	res, err = f.Call(all...)
	check.NoError(t, err)
	out, err = res.AsArray()
	check.NoError(t, err)
	checkSmallCNN(t, out)

	// Neither the inputs nor every parameter: named.
	_, err = f.Call()
	check.Error(t, err, "want the inputs x (the weights are bundled), got 0 arguments")
	check.ErrorIs(t, err, packedfunc.ErrArity)
}

// TestCloseClosesKernels: Close closes the VM and its kernels (a kernel
// taken before fails after, with cpu.ErrClosed) and removes the directory
// the load wrote the library into.
func TestCloseClosesKernels(t *testing.T) {
	a := buildSmallCNN(t)
	m, err := Artifact(a, Options{})
	check.NoError(t, err)
	k, ok := m.Kernels().(*cpu.Module)
	check.True(t, ok, "kernels are a", m.Kernels().Type(), "module")
	dir := filepath.Dir(k.Path())
	_, err = os.Stat(dir)
	check.NoError(t, err, "the load's directory")
	fi := a.Manifest.Functions[0]
	kf, err := k.GetFunction(fi.Name)
	check.NoError(t, err)
	main, err := m.GetFunction("main")
	check.NoError(t, err)

	check.NoError(t, m.Close())
	check.NoError(t, m.Close(), "a second Close")
	_, err = kf.Call()
	check.ErrorIs(t, err, cpu.ErrClosed)
	x, err := ndarray.LoadNPY(filepath.Join(onnxTestdata, "smallcnn_x.npy"))
	check.NoError(t, err)
	_, err = main.Call(packedfunc.Array(x))
	check.True(t, err != nil, "the VM runs after Close")
	_, err = os.Stat(dir)
	check.True(t, errors.Is(err, os.ErrNotExist), "the load's directory is left:", err)

	// A directory the caller gives stays: it is the caller's.
	own := t.TempDir()
	m, err = Artifact(a, Options{Dir: own})
	check.NoError(t, err)
	check.NoError(t, m.Close())
	_, err = os.Stat(own)
	check.NoError(t, err)
}

// TestArtifactForMissingCPUFeatures: an artifact built for CPU features the
// host lacks is refused before its library loads, naming the features and
// the target; one built for the host records the host's features and
// loads. The host is pretended (an AVX2-only x86 CPU) so the answer does
// not depend on where the test runs.
func TestArtifactForMissingCPUFeatures(t *testing.T) {
	mod, err := script.Parse("add.py", `
@I.ir_module
class Module:
    @T.prim_func
    def add(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        for i in range(16):
            with T.block("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] + T.float32(1)
`)
	check.NoError(t, err)
	build := func(target string) *artifact.Artifact {
		res, err := compiler.Build(context.Background(), mod, compiler.MustParseTarget(target), compiler.BuildOptions{NoCache: true})
		check.NoError(t, err, target)
		return res
	}
	native := build("cpu")
	check.True(t, native.Manifest.Attrs[artifact.AttrCPUArch] != "", "no architecture in the manifest:", native.Manifest.Attrs)
	for _, f := range hostcpu.Host().List() {
		check.True(t, strings.Contains(","+native.Manifest.Attrs[artifact.AttrCPUFeatures]+",", ","+f+","),
			"a build for the host does not record its feature", f, native.Manifest.Attrs)
	}
	m, err := Artifact(native, Options{})
	check.NoError(t, err, "the host runs what is built for it")
	check.NoError(t, m.Close())

	if hostcpu.Host().Arch != "amd64" {
		t.Skip("the -mcpu below is an x86 core")
	}
	avx512 := build("cpu -mcpu=skylake-avx512")
	avx2 := hostcpu.Features{Arch: "amd64", Has: map[string]bool{}}
	for _, f := range strings.Split("sse2,sse3,ssse3,sse4.1,sse4.2,popcnt,cx16,sahf,avx,avx2,bmi,bmi2,f16c,fma,lzcnt,movbe", ",") {
		avx2.Has[f] = true
	}
	defer func(h func() hostcpu.Features) { hostFeatures = h }(hostFeatures)
	hostFeatures = func() hostcpu.Features { return avx2 }
	dir := t.TempDir()
	_, err = Artifact(avx512, Options{Dir: dir})
	check.Error(t, err, `it is built for "cpu -mcpu=skylake-avx512"`, "its CPU lacks avx512f, avx512bw, avx512cd, avx512dq, avx512vl")
	left, _ := os.ReadDir(dir)
	check.Equal(t, len(left), 0, "the refused artifact's library was written")

	// Another architecture is named too.
	arm := *native
	arm.Manifest.Attrs = map[string]string{artifact.AttrCPUArch: "arm64"}
	_, err = Artifact(&arm, Options{})
	check.Error(t, err, "is for arm64; this host is amd64")
	// A build without -mattr AVX-512 runs on the AVX2 host.
	m, err = Artifact(build("cpu -mcpu=skylake-avx512 -mattr=-avx512f"), Options{})
	check.NoError(t, err)
	check.NoError(t, m.Close())
}

// checkProfile checks a profile of the ONNX test model's main: every
// kernel once or more an inference with the model operators it computes,
// the most expensive first, shares summing to one, and a trace of one
// inference whose kernel calls lie inside it.
func checkProfile(t *testing.T, p *Profile, rounds int) {
	t.Helper()
	check.Equal(t, p.Function, "main")
	check.Equal(t, p.Rounds, rounds)
	check.True(t, p.ModelSeconds > 0 && p.KernelSeconds > 0, "model", p.ModelSeconds, "kernels", p.KernelSeconds)
	check.True(t, len(p.Kernels) >= 5, "kernels:", p.Kernels)
	ops := map[string]string{}
	var share float64
	var calls int64
	for i, k := range p.Kernels {
		check.True(t, k.Calls >= 1, k.Name, "calls", k.Calls)
		if i > 0 {
			check.True(t, p.Kernels[i-1].Seconds >= k.Seconds, "not the most expensive first:", p.Kernels)
		}
		share += k.Share
		calls += k.Calls
		for _, o := range k.Ops {
			ops[o.Name] = o.Op
		}
	}
	check.True(t, math.Abs(share-1) < 1e-9, "shares sum to", share)
	for name, op := range map[string]string{"/conv1/Conv": "Conv", "/conv2/Conv": "Conv", "/relu/Relu": "Relu", "/pool/MaxPool": "MaxPool", "/fc/Gemm": "Gemm"} {
		check.Equal(t, ops[name], op, "the operator of node", name, "in", p.Kernels)
	}
	check.True(t, len(p.Trace) == int(calls)+1, "trace of", len(p.Trace), "events for", calls, "kernel calls")
	whole := p.Trace[0]
	check.True(t, !whole.Kernel && whole.Name == "main" && whole.DurUS > 0, "the first event is not the inference:", whole)
	for _, e := range p.Trace[1:] {
		check.True(t, e.Kernel && e.StartUS >= 0 && e.DurUS >= 0 && e.StartUS+e.DurUS <= whole.DurUS, "a kernel call outside the inference:", e, whole)
	}
}

// TestProfile profiles the ONNX test model with its input alone (the
// weights bundled), directly and through ProfileFunc as a device daemon
// calls it.
func TestProfile(t *testing.T) {
	m, x := loadSmallCNN(t)
	p, err := m.Profile("main", 4, packedfunc.Array(x))
	check.NoError(t, err)
	checkProfile(t, p, 4)

	f, err := m.GetFunction(ProfileFunc)
	check.NoError(t, err)
	res, err := f.Call(packedfunc.String("main"), packedfunc.Int(3), packedfunc.Array(x))
	check.NoError(t, err)
	text, err := res.AsString()
	check.NoError(t, err)
	var q Profile
	check.NoError(t, json.Unmarshal([]byte(text), &q))
	checkProfile(t, &q, 3)

	_, err = m.Profile("nope", 3, packedfunc.Array(x))
	check.Error(t, err, `no graph function "nope"`)
	_, err = m.Profile("main", 0, packedfunc.Array(x))
	check.Error(t, err, "rounds must be at least 1")
	_, err = f.Call(packedfunc.String("main"))
	check.ErrorIs(t, err, packedfunc.ErrArity)
}

// TestArtifactOnUnreadFeatures: on a CPU whose features cannot be read
// (RISC-V without riscv_hwprobe, as under older qemu-user), an artifact
// that lists features loads on its architecture, and another
// architecture is still refused.
func TestArtifactOnUnreadFeatures(t *testing.T) {
	a := buildSmallCNN(t)
	defer func(h func() hostcpu.Features) { hostFeatures = h }(hostFeatures)
	host := hostcpu.Host()
	hostFeatures = func() hostcpu.Features {
		return hostcpu.Features{Arch: host.Arch, Has: map[string]bool{}, Unread: true}
	}
	wants := *a
	wants.Manifest.Attrs = map[string]string{artifact.AttrCPUArch: host.Arch, artifact.AttrCPUFeatures: "v,zba"}
	check.NoError(t, RunsHere(&wants))
	other := *a
	other.Manifest.Attrs = map[string]string{artifact.AttrCPUArch: "riscv64", artifact.AttrCPUFeatures: "v"}
	if host.Arch == "riscv64" {
		other.Manifest.Attrs[artifact.AttrCPUArch] = "arm64"
	}
	check.Error(t, RunsHere(&other), "this host is "+host.Arch)
}
