package transform

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// concatModule is a graph function computing a = relu(x), b = exp(z),
// c = concat((a, b), axis), d = c + c. body replaces the bindings when
// not empty.
func concatModule(t *testing.T, xs, zs, cs string, axis int, body string) *ir.IRModule {
	t.Helper()
	if body == "" {
		body = fmt.Sprintf(`            a = R.nn.relu(x)
            b = R.exp(z)
            c = R.concat((a, b), axis=%d)
            d = R.add(c, c)`, axis)
	}
	src := fmt.Sprintf(`# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor(%[1]s, dtype="float32"), z: R.Tensor(%[2]s, dtype="float32")) -> R.Tensor(%[3]s, dtype="float32"):
        with R.dataflow():
%[4]s
            R.output(d)
        return d
`, xs, zs, cs, body)
	m, err := script.Parse("concat.py", src)
	check.NoError(t, err)
	return m
}

// TestConcatInPlace checks the planned modules of concatenations whose
// inputs can be written in place (views of the output's storage at the
// inputs' byte offsets, no concatenation call or PrimFunc left) and of those that cannot
// (the concatenation kept), under ConcatInPlace and StaticPlanBlockMemory,
// and that every plan computes what the legalized module computes.
func TestConcatInPlace(t *testing.T) {
	tests := []struct {
		name       string
		x, z, c    string
		axis       int
		body       string
		views      []string // alloc_tensor calls the plan must hold
		noConcat   bool
		planStores int // alloc_storage calls under ConcatInPlace
	}{
		{name: "channels", x: "(1, 4, 4, 4)", z: "(1, 2, 4, 4)", c: "(1, 6, 4, 4)", axis: 1, noConcat: true, planStores: 1,
			views: []string{"(storage, R.prim_value(0), R.shape([1, 4, 4, 4])", "(storage, R.prim_value(256), R.shape([1, 2, 4, 4])",
				"(storage, R.prim_value(0), R.shape([1, 6, 4, 4])"}},
		{name: "rows of a plane", x: "(1, 1, 2, 8)", z: "(1, 1, 3, 8)", c: "(1, 1, 5, 8)", axis: 2, noConcat: true, planStores: 1,
			views: []string{"(storage, R.prim_value(64), R.shape([1, 1, 3, 8])"}},
		{name: "batch axis", x: "(2, 16)", z: "(1, 16)", c: "(3, 16)", axis: 0, noConcat: true, planStores: 1,
			views: []string{"(storage, R.prim_value(128), R.shape([1, 16])"}},
		{name: "three inputs", x: "(1, 4, 16)", z: "(1, 2, 16)", c: "(1, 8, 16)", noConcat: true, planStores: 1, body: `            a = R.nn.relu(x)
            b = R.exp(z)
            e = R.nn.relu(z)
            c = R.concat((a, b, e), axis=1)
            d = R.add(c, c)`,
			views: []string{"(storage, R.prim_value(256), R.shape([1, 2, 16])", "(storage, R.prim_value(384), R.shape([1, 2, 16])"}},
		{name: "two concatenations", x: "(1, 4, 16)", z: "(1, 2, 16)", c: "(1, 6, 16)", noConcat: true, planStores: 1, body: `            a = R.nn.relu(x)
            b = R.exp(z)
            c0 = R.concat((a, b), axis=1)
            a1 = R.nn.relu(c0)
            p = R.strided_slice(a1, axes=[1], begin=[0], end=[4])
            b1 = R.exp(z)
            q = R.nn.relu(p)
            c = R.concat((q, b1), axis=1)
            d = R.add(c, c)`,
			views: []string{"(storage, R.prim_value(256), R.shape([1, 2, 16])"}},
		{name: "nested", x: "(1, 4, 16)", z: "(1, 2, 16)", c: "(1, 8, 16)", noConcat: false, planStores: 1, body: `            a = R.nn.relu(x)
            b = R.exp(z)
            c0 = R.concat((a, b), axis=1)
            e = R.nn.relu(z)
            c = R.concat((c0, e), axis=1)
            d = R.add(c, c)`,
			views: []string{"(storage, R.prim_value(256), R.shape([1, 2, 16])", "(storage, R.prim_value(0), R.shape([1, 6, 16])"}},
		{name: "an offset not a multiple of 64 bytes", x: "(1, 4, 3, 3)", z: "(1, 2, 3, 3)", c: "(1, 6, 3, 3)", axis: 1},
		{name: "batch 2 before the axis", x: "(2, 4, 16)", z: "(2, 2, 16)", c: "(2, 6, 16)", axis: 1},
		{name: "an input used twice", x: "(1, 4, 16)", z: "(1, 2, 16)", c: "(1, 6, 16)", body: `            a = R.nn.relu(x)
            b = R.exp(z)
            c = R.concat((a, b), axis=1)
            s = R.strided_slice(c, axes=[1], begin=[0], end=[4])
            e = R.add(s, a)
            d = R.concat((e, b), axis=1)`},
		{name: "an input that is a parameter", x: "(1, 4, 16)", z: "(1, 2, 16)", c: "(1, 6, 16)", body: `            b = R.exp(z)
            c = R.concat((x, b), axis=1)
            d = R.add(c, c)`},
		{name: "an input that is the result", x: "(1, 4, 16)", z: "(1, 2, 16)", c: "(1, 4, 16)", body: `            d = R.nn.relu(x)
            b = R.exp(z)
            c = R.concat((d, b), axis=1)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := concatModule(t, tc.x, tc.z, tc.c, tc.axis, tc.body)
			legal := runVerified(t, in, "LegalizeOps")
			inputs := randomInputs(t, in)
			want := runMain(t, legal, inputs)
			for _, pass := range []string{"ConcatInPlace", "StaticPlanBlockMemory"} {
				out := runVerified(t, legal, pass)
				text := script.Print(out)
				f, _ := out.Lookup("main")
				mainText := script.Print(ir.NewIRModule().With("main", f))
				// Neither the call nor, when no call is left, the PrimFunc.
				check.Equal(t, !strings.Contains(text, "concatenate"), tc.noConcat, pass, "\n", text)
				for _, v := range tc.views {
					check.True(t, strings.Contains(mainText, "R.memory.alloc_tensor"+v), pass, v, "\n", text)
				}
				if pass == "ConcatInPlace" {
					check.Equal(t, strings.Count(mainText, "R.memory.alloc_storage"), tc.planStores, pass, "\n", text)
					if tc.planStores == 0 {
						check.True(t, out == legal, "nothing changes")
					}
				}
				sameResults(t, runMain(t, out, inputs), want)
			}
		})
	}
}

// TestConcatInPlaceFused checks that a concatenation fused with an
// elementwise consumer is left alone by O2.
func TestConcatInPlaceFused(t *testing.T) {
	in := concatModule(t, "(1, 4, 16)", "(1, 2, 16)", "(1, 6, 16)", 0, `            a = R.nn.relu(x)
            b = R.exp(z)
            c = R.concat((a, b), axis=1)
            d = R.nn.relu(c)`)
	out := runVerified(t, in, pipelines["O2"]...)
	text := script.Print(out)
	check.True(t, strings.Contains(text, "fused_"), text)
	check.True(t, !strings.Contains(text, "R.memory.alloc_storage"), text)
	inputs := randomInputs(t, in)
	sameResults(t, runMain(t, out, inputs), runMain(t, runVerified(t, in, "LegalizeOps"), inputs))
}

// TestConcatPrimFunc checks which PrimFuncs are recognised as plain
// concatenations.
func TestConcatPrimFunc(t *testing.T) {
	const head = `# from tvm.script import ir as I
# from tvm.script import tir as T
@I.ir_module
class Module:
    @T.prim_func(private=True)
    def f(a: T.Buffer((T.int64(1), T.int64(4), T.int64(3)), "float32"), b: T.Buffer((T.int64(1), T.int64(2), T.int64(3)), "float32"), c: T.Buffer((T.int64(1), T.int64(6), T.int64(3)), "float32")):
        T.func_attr({"op_pattern": 2, "tir.noalias": T.bool(True)})
        for ax0, ax1, ax2 in T.grid(T.int64(1), T.int64(6), T.int64(3)):
            with T.block("T_concat"):
                v0, v1, v2 = T.axis.remap("SSS", [ax0, ax1, ax2])
                T.reads()
                T.writes(c[v0, v1, v2])
`
	for _, tc := range []struct {
		name, value string
		ok          bool
	}{
		{"concat", `T.if_then_else(v1 < T.int64(4), a[v0, v1, v2], b[v0, v1 - T.int64(4), v2])`, true},
		{"select", `T.Select(v1 < T.int64(4), a[v0, v1, v2], b[v0, v1 - T.int64(4), v2])`, true},
		{"wrong offset", `T.if_then_else(v1 < T.int64(4), a[v0, v1, v2], b[v0, v1 - T.int64(3), v2])`, false},
		{"wrong split", `T.if_then_else(v1 < T.int64(3), a[v0, v1, v2], b[v0, v1 - T.int64(4), v2])`, false},
		{"inputs swapped", `T.if_then_else(v1 < T.int64(2), b[v0, v1, v2], a[v0, v1 - T.int64(2), v2])`, false},
		{"other axis", `T.if_then_else(v2 < T.int64(4), a[v0, v1, v2], b[v0, v1 - T.int64(4), v2])`, false},
		{"one input", `a[v0, v1, v2]`, false},
		{"with a relu", `T.max(T.if_then_else(v1 < T.int64(4), a[v0, v1, v2], b[v0, v1 - T.int64(4), v2]), T.float32(0))`, false},
		{"transposed read", `T.if_then_else(v1 < T.int64(4), a[v0, v1, v2], b[v0, v2, v1 - T.int64(4)])`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := script.Parse("f.py", head+"                c[v0, v1, v2] = "+tc.value+"\n")
			check.NoError(t, err)
			axis, ok := concatPrimFunc(m.PrimFunc("f"))
			check.Equal(t, ok, tc.ok)
			if ok {
				check.Equal(t, axis, 1)
			}
		})
	}
	// What LegalizeOps makes of R.concat, on every axis.
	for axis := range 3 {
		shape := func(n int) string {
			d := []int{1, 2, 3}
			d[axis] = n
			return fmt.Sprintf("(%d, %d, %d)", d[0], d[1], d[2])
		}
		in := concatModule(t, shape(2), shape(3), shape(5), axis, fmt.Sprintf(`            d = R.concat((x, z), axis=%d)`, axis))
		legal := runVerified(t, in, "LegalizeOps")
		got, ok := concatPrimFunc(legal.PrimFunc("concatenate"))
		check.True(t, ok, axis)
		check.Equal(t, got, axis)
	}
}
