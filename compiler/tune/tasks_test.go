package tune

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
	"github.com/kiln-ml/kiln/internal/check"
)

// float32Value is the ONNX value info of a float32 tensor of shape dims.
func float32Value(name string, dims ...int64) *onnxpb.ValueInfoProto {
	var ds []*onnxpb.TensorShapeProto_Dimension
	for _, d := range dims {
		ds = append(ds, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
	}
	return &onnxpb.ValueInfoProto{Name: proto.String(name), Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
		TensorType: &onnxpb.TypeProto_Tensor{ElemType: proto.Int32(int32(onnxpb.TensorProto_FLOAT)), Shape: &onnxpb.TensorShapeProto{Dim: ds}}}}}
}

// twoConvModel is an ONNX model of three 3×3 convolutions with ReLU over
// [1, 8, 8, 8]: the first two identical in shape (8 → 8 channels, weights
// of their own), the third 8 → 16.
func twoConvModel(t *testing.T) []byte {
	t.Helper()
	f32 := int32(onnxpb.TensorProto_FLOAT)
	weight := func(name string, dims ...int64) *onnxpb.TensorProto {
		n := int64(1)
		for _, d := range dims {
			n *= d
		}
		raw := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(float32(i%7)*0.01-0.03))
		}
		return &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(f32), Dims: dims, RawData: raw}
	}
	conv := func(in, w, out string) *onnxpb.NodeProto {
		return &onnxpb.NodeProto{OpType: proto.String("Conv"), Input: []string{in, w}, Output: []string{out}, Name: proto.String(out),
			Attribute: []*onnxpb.AttributeProto{{Name: proto.String("pads"), Type: onnxpb.AttributeProto_INTS.Enum(), Ints: []int64{1, 1, 1, 1}}}}
	}
	relu := func(in, out string) *onnxpb.NodeProto {
		return &onnxpb.NodeProto{OpType: proto.String("Relu"), Input: []string{in}, Output: []string{out}, Name: proto.String(out)}
	}
	m := &onnxpb.ModelProto{IrVersion: proto.Int64(8), OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(13)}},
		Graph: &onnxpb.GraphProto{
			Name:        proto.String("twoconv"),
			Input:       []*onnxpb.ValueInfoProto{float32Value("x", 1, 8, 8, 8)},
			Initializer: []*onnxpb.TensorProto{weight("w1", 8, 8, 3, 3), weight("w2", 8, 8, 3, 3), weight("w3", 16, 8, 3, 3)},
			Node: []*onnxpb.NodeProto{conv("x", "w1", "c1"), relu("c1", "r1"), conv("r1", "w2", "c2"), relu("c2", "r2"),
				conv("r2", "w3", "c3"), relu("c3", "y")},
			Output: []*onnxpb.ValueInfoProto{float32Value("y", 1, 16, 8, 8)},
		}}
	b, err := proto.Marshal(m)
	check.NoError(t, err)
	return b
}

// denseModel is an ONNX model of two dense layers with ReLU between
// them: x (8×64) · w1 (64×96), then · w2 (96×32).
func denseModel(t *testing.T) []byte {
	t.Helper()
	f32 := int32(onnxpb.TensorProto_FLOAT)
	weight := func(name string, dims ...int64) *onnxpb.TensorProto {
		n := dims[0] * dims[1]
		raw := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(float32(i%5)*0.02-0.04))
		}
		return &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(f32), Dims: dims, RawData: raw}
	}
	node := func(op string, out string, in ...string) *onnxpb.NodeProto {
		return &onnxpb.NodeProto{OpType: proto.String(op), Input: in, Output: []string{out}, Name: proto.String(out)}
	}
	m := &onnxpb.ModelProto{IrVersion: proto.Int64(8), OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(13)}},
		Graph: &onnxpb.GraphProto{
			Name:        proto.String("dense"),
			Input:       []*onnxpb.ValueInfoProto{float32Value("x", 8, 64)},
			Initializer: []*onnxpb.TensorProto{weight("w1", 64, 96), weight("w2", 96, 32)},
			Node:        []*onnxpb.NodeProto{node("MatMul", "h", "x", "w1"), node("Relu", "r", "h"), node("MatMul", "y", "r", "w2")},
			Output:      []*onnxpb.ValueInfoProto{float32Value("y", 8, 32)},
		}}
	b, err := proto.Marshal(m)
	check.NoError(t, err)
	return b
}

// TestTasksDedupModel: a model's two identical convolution layers are one
// task of weight 2 (the call count of their kernel), the third layer is a
// task of its own, and the weights' layout transforms, which run once per
// set of weights, are not tasks.
func TestTasksDedupModel(t *testing.T) {
	mod, _, err := onnx.ImportBytes("twoconv.onnx", twoConvModel(t), onnx.Options{})
	check.NoError(t, err)
	target, err := compiler.ParseTarget("cpu")
	check.NoError(t, err)
	mod, err = compiler.GraphPipeline(mod, target, "", false, nil)
	check.NoError(t, err)
	tasks, skipped, err := Tasks(mod, rules.Target{Kind: "cpu", VectorBytes: target.VectorBytes()}, nil)
	check.NoError(t, err)
	check.Equal(t, len(tasks), 2, tasks)
	byWeight := map[int]*Task{}
	for _, tk := range tasks {
		byWeight[tk.Weight] = tk
	}
	pair, single := byWeight[2], byWeight[1]
	check.True(t, pair != nil && single != nil, "weights:", tasks[0].Weight, tasks[1].Weight)
	check.True(t, pair.Workload.Hash != single.Workload.Hash)
	check.Equal(t, pair.Workload.Name, pair.Name, "the records of a private kernel are named after it")
	check.True(t, single.Flops > pair.Flops, single.Flops, pair.Flops)
	calls := CallCounts(mod)
	for name := range mod.PrimFuncs() {
		if calls[name] == 0 {
			check.True(t, cachedCallee(mod, name), name, "is called by no graph function")
			check.True(t, strings.Contains(strings.Join(skipped, "\n"), name+": runs once per set of weights"), skipped)
		}
	}
}

// TestTasksDedupHash: two functions of one structure under different
// names are one task of weight 2 that names both.
func TestTasksDedupHash(t *testing.T) {
	a := matmulFunc(t, 16, 16, 16)
	mod := ir.NewIRModule().With("mm_a", a.WithAttr(ir.AttrGlobalSymbol, "mm_a")).With("mm_b", a.WithAttr(ir.AttrGlobalSymbol, "mm_b")).
		With("mm_c", matmulFunc(t, 32, 16, 16))
	tasks, _, err := Tasks(mod, rules.Target{Kind: "cpu", VectorBytes: 16}, nil)
	check.NoError(t, err)
	check.Equal(t, len(tasks), 2)
	check.Equal(t, tasks[0].Weight, 2)
	check.Equal(t, strings.Join(tasks[0].Funcs, ","), "mm_a,mm_b")
	check.Equal(t, tasks[1].Weight, 1)
}
