package onnx

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

func readModel(t *testing.T, m *onnxpb.ModelProto) *Model {
	t.Helper()
	got, err := Read(marshal(t, m), "")
	check.NoError(t, err)
	return got
}

func TestImportLinear(t *testing.T) {
	m := readModel(t, linearModel())
	_, _, err := Import(m, Options{})
	check.Error(t, err, `input "x": dim 0 is symbolic ("N")`, "--input-shape x=")
	_, _, err = Import(m, Options{InputShapes: map[string][]int64{"x": {4}}})
	check.Error(t, err, "--input-shape x: 1 dims given, the model's input has 2")
	_, _, err = Import(m, Options{InputShapes: map[string][]int64{"y": {4, 3}}})
	check.Error(t, err, `--input-shape "y": the model has no such input`, `"x"`)
	_, _, err = Import(m, Options{InputShapes: map[string][]int64{"x": {4, 5}}})
	check.Error(t, err, "dim 1 is 3 in the model, 5 given")

	mod, ps, err := Import(m, Options{InputShapes: map[string][]int64{"x": {4, 3}}, ConstLimit: 1})
	check.NoError(t, err)
	f, ok := mod.Lookup("main")
	check.True(t, ok)
	fn := f.(*ir.Function)
	var names []string
	for _, p := range fn.Params {
		names = append(names, p.Name)
	}
	// The weight stored transposed for Gemm(transB=1) is a weight of
	// shape [3, 2]; the input keeps its name.
	check.Equal(t, strings.Join(names, ","), "x,fc_weight,fc_bias")
	check.Equal(t, ps.Names(), []string{"fc_weight", "fc_bias"})
	check.Equal(t, ps.Tensors()[0].Shape, []int64{3, 2})
	check.Equal(t, ps.Tensors()[0].Floats(), []float64{1, -1, 2, -2, 3, -3})
	check.Equal(t, fn.Attrs["num_input"], any(int64(1)))
	ret, _ := fn.Body.Body.(*ir.RVar).Info.(*ir.TensorStructInfo).KnownShape()
	check.Equal(t, ret, []int64{4, 2})
}

func TestImportUnsupported(t *testing.T) {
	pm := linearModel()
	pm.Graph.Node = append(pm.Graph.Node, nodeOf("Frobnicate", []string{"y"}, []string{"z"}))
	pm.Graph.Output[0].Name = proto.String("z")
	m := readModel(t, pm)
	_, _, err := Import(m, Options{InputShapes: map[string][]int64{"x": {1, 3}}})
	check.ErrorIs(t, err, ErrUnsupported)
	check.Error(t, err, `node "frobnicate_z" (Frobnicate), opset 13`)
}

// TestImportOldOpset checks that a model older than opset 7 imports when
// its operators mean what they do in opset 7 (Relu), and is refused,
// naming the node, when one does not (Gemm had a broadcast attribute).
func TestImportOldOpset(t *testing.T) {
	pm := linearModel()
	pm.OpsetImport[0].Version = proto.Int64(6)
	_, _, err := Import(readModel(t, pm), Options{InputShapes: map[string][]int64{"x": {1, 3}}})
	check.ErrorIs(t, err, ErrUnsupported)
	check.Error(t, err, `(Gemm), opset 6`)

	pm.Graph.Node = pm.Graph.Node[1:]
	pm.Graph.Node[0].Input[0] = "x"
	pm.Graph.Output[0] = vinfo("y", onnxpb.TensorProto_FLOAT, "N", 3)
	for _, v := range []int64{1, 6} {
		pm.OpsetImport[0].Version = proto.Int64(v)
		mod, _, err := Import(readModel(t, pm), Options{InputShapes: map[string][]int64{"x": {1, 3}}})
		check.NoError(t, err)
		_, ok := mod.Lookup("main")
		check.True(t, ok)
	}
}

// TestShapeSubgraphFolds checks that PyTorch's Shape → Gather → Unsqueeze
// → Concat → Reshape (the flatten before a classifier) folds to one
// reshape with a constant shape.
func TestShapeSubgraphFolds(t *testing.T) {
	pm := model(13, &onnxpb.GraphProto{
		Name:  proto.String("flatten"),
		Input: []*onnxpb.ValueInfoProto{vinfo("x", onnxpb.TensorProto_FLOAT, 2, 3, 4)},
		Initializer: []*onnxpb.TensorProto{
			int64Init("zero", 0), int64Init("minus1", -1),
		},
		Node: []*onnxpb.NodeProto{
			nodeOf("Shape", []string{"x"}, []string{"s"}),
			nodeOf("Gather", []string{"s", "zero"}, []string{"n"}),
			nodeOf("Concat", []string{"n", "minus1"}, []string{"shape"}, intAttr("axis", 0)),
			nodeOf("Reshape", []string{"x", "shape"}, []string{"y"}),
		},
		Output: []*onnxpb.ValueInfoProto{vinfo("y", onnxpb.TensorProto_FLOAT, 2, 12)},
	})
	mod, _, err := Import(readModel(t, pm), Options{})
	check.NoError(t, err)
	f, _ := mod.Lookup("main")
	bs := f.(*ir.Function).Body.Blocks[0].Bindings
	check.Equal(t, len(bs), 2, "a reshape and the output binding")
	call := bs[0].BoundValue().(*ir.RCall)
	check.Equal(t, call.Op.(*ir.Op).Name, "relax.reshape")
}

// TestImportBitShiftErrors checks that BitShift names a bad direction
// and refuses signed or mixed operand types.
func TestImportBitShiftErrors(t *testing.T) {
	shift := func(elem onnxpb.TensorProto_DataType, dir string) error {
		attr := &onnxpb.AttributeProto{Name: proto.String("direction"), Type: onnxpb.AttributeProto_STRING.Enum(), S: []byte(dir)}
		pm := model(11, &onnxpb.GraphProto{
			Name:   proto.String("shift"),
			Input:  []*onnxpb.ValueInfoProto{vinfo("x", elem, 3), vinfo("s", elem, 3)},
			Node:   []*onnxpb.NodeProto{nodeOf("BitShift", []string{"x", "s"}, []string{"y"}, attr)},
			Output: []*onnxpb.ValueInfoProto{vinfo("y", elem, 3)},
		})
		_, _, err := Import(readModel(t, pm), Options{})
		return err
	}
	check.NoError(t, shift(onnxpb.TensorProto_UINT32, "LEFT"))
	check.NoError(t, shift(onnxpb.TensorProto_UINT8, "RIGHT"))
	check.Error(t, shift(onnxpb.TensorProto_UINT8, "UP"), `BitShift direction "UP", want LEFT or RIGHT`)
	check.Error(t, shift(onnxpb.TensorProto_INT32, "LEFT"), "BitShift of int32 by int32, want the same unsigned integer type")
}

// TestImportScatterErrors checks that ScatterND and ScatterElements name
// updates of the wrong shape and a reduction kiln does not import.
func TestImportScatterErrors(t *testing.T) {
	scatter := func(op string, idx, upd []any, attrs ...*onnxpb.AttributeProto) error {
		pm := model(16, &onnxpb.GraphProto{
			Name: proto.String("scatter"),
			Input: []*onnxpb.ValueInfoProto{vinfo("x", onnxpb.TensorProto_FLOAT, 4, 3),
				vinfo("i", onnxpb.TensorProto_INT64, idx...), vinfo("u", onnxpb.TensorProto_FLOAT, upd...)},
			Node:   []*onnxpb.NodeProto{nodeOf(op, []string{"x", "i", "u"}, []string{"y"}, attrs...)},
			Output: []*onnxpb.ValueInfoProto{vinfo("y", onnxpb.TensorProto_FLOAT, 4, 3)},
		})
		_, _, err := Import(readModel(t, pm), Options{})
		return err
	}
	maxRed := &onnxpb.AttributeProto{Name: proto.String("reduction"), Type: onnxpb.AttributeProto_STRING.Enum(), S: []byte("max")}
	check.NoError(t, scatter("ScatterND", []any{2, 1}, []any{2, 3}))
	check.NoError(t, scatter("ScatterElements", []any{2, 3}, []any{2, 3}, intAttr("axis", 1)))
	check.Error(t, scatter("ScatterND", []any{2, 1}, []any{2, 2}), "updates float32[2 2], want float32[2 3]")
	check.Error(t, scatter("ScatterND", []any{2, 3}, []any{2}), "indices of shape [2 3] for data of shape [4 3]")
	check.Error(t, scatter("ScatterElements", []any{2, 3}, []any{3, 3}), "updates float32[3 3] for indices of shape [2 3]")
	err := scatter("ScatterND", []any{2, 1}, []any{2, 3}, maxRed) // max came in opset 18
	check.ErrorIs(t, err, ErrUnsupported)
	check.Error(t, err, `ScatterND with reduction "max"`)
}

// TestImportTiedWeight: one initializer used as is by a MatMul and
// transposed by a Gemm (transB=1), as a language model's tied embedding
// and output head are, becomes two weights, each with its own data.
func TestImportTiedWeight(t *testing.T) {
	pm := model(13, &onnxpb.GraphProto{
		Name:        proto.String("tied"),
		Input:       []*onnxpb.ValueInfoProto{vinfo("x", onnxpb.TensorProto_FLOAT, 1, 2)},
		Initializer: []*onnxpb.TensorProto{floatInit("w", []int64{2, 2}, 1, 2, 3, 4)},
		Node: []*onnxpb.NodeProto{
			nodeOf("MatMul", []string{"x", "w"}, []string{"a"}),
			nodeOf("Gemm", []string{"x", "w"}, []string{"b"}, intAttr("transB", 1)),
			nodeOf("Add", []string{"a", "b"}, []string{"y"}),
		},
		Output: []*onnxpb.ValueInfoProto{vinfo("y", onnxpb.TensorProto_FLOAT, 1, 2)},
	})
	_, ps, err := Import(readModel(t, pm), Options{ConstLimit: 1})
	check.NoError(t, err)
	check.Equal(t, len(ps.Tensors()), 2)
	check.Equal(t, ps.Tensors()[0].Floats(), []float64{1, 2, 3, 4})
	check.Equal(t, ps.Tensors()[1].Floats(), []float64{1, 3, 2, 4})
	check.True(t, ps.Names()[0] != ps.Names()[1], "weight names %v", ps.Names())
}
