package main

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// matmulGraph is the tensor-expression tutorial's matmul as kiln.te
// encodes it: C[x, y] = sum over k of A[x, k] * B[k, y], N symbolic.
const matmulGraph = `{"vars": [{"name": "N", "dtype": "int32"}],
 "axes": [{"name": "k", "min": ["int", 0, "int32"], "extent": ["int", 16, "int32"]}],
 "tensors": [
  {"name": "A", "dtype": "float32", "shape": [["var", 0], ["int", 16, "int32"]]},
  {"name": "B", "dtype": "float32", "shape": [["int", 16, "int32"], ["int", 8, "int32"]]},
  {"name": "C", "shape": [["var", 0], ["int", 8, "int32"]], "axis_names": ["x", "y"],
   "body": ["reduce", "sum", ["bin", "mul", ["load", 0, [["index", 0], ["axis", 0]]], ["load", 1, [["axis", 0], ["index", 1]]]], [0]]}],
 "args": [0, 1, 2], "name": "mmult"}`

func TestTEGraph(t *testing.T) {
	f, err := primFuncFromTE([]byte(matmulGraph))
	check.NoError(t, err)
	text := moduleText(f)
	for _, want := range []string{"def mmult(", `T.block("C")`, "for x, y, k in T.grid(N, 8, 16)", "T.init()", "C[v_x, v_y] = C[v_x, v_y] + A[v_x, v_k] * B[v_k, v_y]"} {
		check.True(t, strings.Contains(text, want), "missing "+want+" in\n"+text)
	}
	// The text parses back, and schedule primitives apply through apply.
	g, err := primFuncOf(text, "")
	check.NoError(t, err)
	s, err := schedule.New(g)
	check.NoError(t, err)
	o := &schedObj{s: s}
	_, err = o.apply("get_block", []byte(`["C"]`))
	check.NoError(t, err)
	loops, err := o.apply("get_loops", []byte(`[{"block": 0}]`))
	check.NoError(t, err)
	check.Equal(t, len(loops.([]rvRef)), 3)
	_, err = o.apply("split", []byte(`[{"loop": 1}, [null, 4]]`))
	check.NoError(t, err)
	_, err = o.apply("parallel", []byte(`[{"loop": 3}]`))
	check.NoError(t, err)
	_, err = o.apply("vectorize", []byte(`[{"loop": 4}]`))
	check.NoError(t, err)
	out := script.Print(o.s.Func())
	check.True(t, strings.Contains(out, "T.parallel(2)") && strings.Contains(out, "T.vectorized(4)"), out)
}

func TestTEGraphErrors(t *testing.T) {
	ph := `{"name": "A", "dtype": "float32", "shape": [["int", 8, "int32"]]}`
	for _, tc := range []struct{ name, graph, want string }{
		{"json", `{"tensors": [`, "bad JSON"},
		{"unknown field", `{"tensor": []}`, "unknown field"},
		{"dtype", `{"tensors": [{"name": "A", "dtype": "float33", "shape": []}]}`, `te.placeholder "A"`},
		{"var dtype", `{"vars": [{"name": "n", "dtype": "float32"}]}`, `te.var "n": dtype float32, want an integer`},
		{"arity", `{"tensors": [` + ph + `, {"name": "C", "shape": [["int", 8, "int32"]], "body": ["load", 0, [["index", 0], ["index", 0]]]}], "args": [0, 1]}`,
			`tensor "A" has 1 dimensions, indexed with 2 indices`},
		{"no such index", `{"tensors": [` + ph + `, {"name": "C", "shape": [["int", 8, "int32"]], "body": ["load", 0, [["index", 3]]]}], "args": [0, 1]}`,
			"no index variable 3"},
		{"op", `{"tensors": [` + ph + `, {"name": "C", "shape": [["int", 8, "int32"]], "body": ["bin", "pow", ["int", 1, "int32"], ["int", 1, "int32"]]}], "args": [0, 1]}`,
			`unknown operator "pow"`},
		{"intrinsic", `{"tensors": [` + ph + `, {"name": "C", "shape": [["int", 8, "int32"]], "body": ["call", "nosuch", [["float", 1, "float32"]]]}], "args": [0, 1]}`,
			`unknown intrinsic "nosuch"`},
		{"missing input", `{"tensors": [` + ph + `, {"name": "C", "shape": [["int", 8, "int32"]], "body": ["load", 0, [["index", 0]]]}], "args": [1]}`,
			`placeholder "A" read by "C" is not among the arguments`},
		{"arg", `{"tensors": [` + ph + `], "args": [4]}`, "argument 0: no tensor 4"},
		{"reduce kind", `{"axes": [{"name": "k", "min": ["int", 0, "int32"], "extent": ["int", 8, "int32"]}], "tensors": [` + ph +
			`, {"name": "C", "shape": [["int", 1, "int32"]], "body": ["reduce", "prod", ["load", 0, [["axis", 0]]], [0]]}], "args": [0, 1]}`,
			`unknown kind "prod"`},
		{"float index", `{"tensors": [` + ph + `, {"name": "C", "shape": [["int", 8, "int32"]], "body": ["load", 0, [["float", 1, "float32"]]]}], "args": [0, 1]}`,
			"want an integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := primFuncFromTE([]byte(tc.graph))
			check.Error(t, err, tc.want)
		})
	}
}

func TestScheduleApplyErrors(t *testing.T) {
	f, err := primFuncFromTE([]byte(matmulGraph))
	check.NoError(t, err)
	s, err := schedule.New(f)
	check.NoError(t, err)
	o := &schedObj{s: s}
	_, err = o.apply("get_block", []byte(`["C"]`))
	check.NoError(t, err)
	_, err = o.apply("get_loops", []byte(`[{"block": 0}]`))
	check.NoError(t, err)
	for _, tc := range []struct{ prim, args, want string }{
		{"split", `[{"loop": 0}, [null, 0]]`, `factor 1 of loop "x" is 0`},
		{"split", `[{"loop": 0}, [null, -1]]`, "write None"},
		{"split", `[{"block": 0}, [null, 2]]`, `argument 0 is the block "", want a loop`},
		{"parallel", `[{"loop": 9}]`, "not a loop of this schedule"},
		{"parallel", `[{"loop": 2}]`, "parallel"},
		{"tile", `[]`, `no primitive "tile"`},
		{"get_loops", `[]`, "get_loops takes 1 arguments, got 0"},
		{"get_block", `"C"`, "not a JSON list"},
	} {
		_, err := o.apply(tc.prim, []byte(tc.args))
		check.Error(t, err, tc.want)
	}
}
