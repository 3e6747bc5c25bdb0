package transform

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

func lowerForSplit(t *testing.T, src string) *ir.PrimFunc {
	t.Helper()
	m, err := script.Parse("split.py", "# from tvm.script import tir as T\n"+src)
	check.NoError(t, err)
	for _, f := range m.PrimFuncs() {
		g, err := Lower(f, Options{StopAfter: "storage_rewrite", Verify: true})
		check.NoError(t, err)
		return g
	}
	t.Fatal("no PrimFunc")
	return nil
}

// TestSplitHostDevice: two nests become two kernels launched in order by
// the host; a shape variable the nests use becomes a kernel parameter; the
// shared buffer moves into the kernel that uses it; the host checks
// tensors are on the device.
func TestSplitHostDevice(t *testing.T) {
	f := lowerForSplit(t, `@T.prim_func
def two(a: T.handle, b: T.handle):
    T.func_attr({"global_symbol": "two"})
    n = T.int32()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (64,), "float32")
    S = T.alloc_buffer((64,), scope="shared")
    for bx in T.thread_binding((n + 63) // 64, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.block("A"):
                T.where(bx * 64 + tx < n)
                vi = T.axis.spatial(n, bx * 64 + tx)
                A[vi] = A[vi] * T.float32(2)
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        with T.block("S"):
            vi = T.axis.spatial(64, tx)
            S[vi] = B[vi]
        with T.block("B"):
            vi = T.axis.spatial(64, tx)
            B[vi] = S[63 - vi]
`)
	host, kernels, launches, err := SplitHostDevice(f, 2)
	check.NoError(t, err)
	check.Equal(t, len(kernels), 2)
	check.Equal(t, FuncName(kernels[0]), "two_kernel0")
	check.Equal(t, FuncName(kernels[1]), "two_kernel1")
	check.Equal(t, launches[0].Kernel, "two_kernel0")
	check.Equal(t, kernels[0].Attrs[AttrDeviceKernel], any(true))
	// Kernel 0 takes the two buffers and n.
	check.Equal(t, len(kernels[0].Params), 3)
	check.Equal(t, kernels[0].Params[2].Name, "n")
	check.Equal(t, len(kernels[1].Params), 2)
	text := script.Print(host)
	check.True(t, strings.Contains(text, `"kiln_launch_two_kernel0"`), text)
	check.True(t, strings.Contains(text, `"kiln_launch_two_kernel1"`), text)
	check.True(t, strings.Index(text, "kiln_launch_two_kernel0") < strings.Index(text, "kiln_launch_two_kernel1"), "launches out of order:", text)
	check.True(t, !strings.Contains(text, "thread_binding"), "the host kept a thread-bound loop:", text)
	check.True(t, strings.Contains(script.Print(kernels[1]), "shared"), "the shared buffer did not move into kernel 1")
	check.Equal(t, host.Attrs[AttrDeviceType], any(int64(2)))

	packed, err := MakePackedAPI(host)
	check.NoError(t, err)
	check.True(t, strings.Contains(script.Print(packed), "want a tensor on cuda"), script.Print(packed))
}

// TestSplitVirtualThreads: a loop bound to a virtual thread runs serially
// in each thread of the kernel.
func TestSplitVirtualThreads(t *testing.T) {
	f := lowerForSplit(t, `@T.prim_func
def vt(A: T.Buffer((256,), "float32")):
    T.func_attr({"global_symbol": "vt"})
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        for v in T.thread_binding(4, thread="vthread.x"):
            with T.block("A"):
                vi = T.axis.spatial(256, v * 64 + tx)
                A[vi] = T.float32(1)
`)
	_, kernels, launches, err := SplitHostDevice(f, 2)
	check.NoError(t, err)
	check.Equal(t, len(kernels), 1)
	check.Equal(t, launches[0].Block[0].String(), "T.int64(64)")
	text := script.Print(kernels[0])
	check.True(t, !strings.Contains(text, "vthread"), text)
	check.True(t, strings.Contains(text, "for v in range(4)"), text)
}

func TestSplitHostDeviceErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"no binding", `@T.prim_func
def plain(A: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "plain"})
    for i in range(8):
        with T.block("A"):
            vi = T.axis.spatial(8, i)
            A[vi] = T.float32(0)
`, `function "plain" has no thread-bound loop`},
		{"host read", `@T.prim_func
def hostread(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "hostread"})
    for i in range(8):
        with T.block("B"):
            vi = T.axis.spatial(8, i)
            B[vi] = A[vi]
    for tx in T.thread_binding(8, thread="threadIdx.x"):
        with T.block("A"):
            vi = T.axis.spatial(8, tx)
            A[vi] = T.float32(0)
`, `store to "B" outside every thread-bound loop`},
		{"two extents", `@T.prim_func
def ext(A: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "ext"})
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.block("A"):
                vi = T.axis.spatial(64, bx * 32 + tx)
                A[vi] = T.float32(0)
        for tx in T.thread_binding(16, thread="threadIdx.x"):
            with T.block("B"):
                vi = T.axis.spatial(64, bx * 32 + tx)
                A[vi] = T.float32(1)
`, `threadIdx.x is bound with extent 32 and with extent 16`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := SplitHostDevice(lowerForSplit(t, tc.src), 2)
			check.Error(t, err, tc.want)
		})
	}
}
