package onnx

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"github.com/kiln-ml/kiln/internal/check"
)

// Helpers that build small models in memory, the way onnx.helper does.

func vinfo(name string, elem onnxpb.TensorProto_DataType, dims ...any) *onnxpb.ValueInfoProto {
	var ds []*onnxpb.TensorShapeProto_Dimension
	for _, d := range dims {
		switch d := d.(type) {
		case int:
			ds = append(ds, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}})
		case string:
			ds = append(ds, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimParam{DimParam: d}})
		}
	}
	return &onnxpb.ValueInfoProto{Name: proto.String(name), Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
		TensorType: &onnxpb.TypeProto_Tensor{ElemType: proto.Int32(int32(elem)), Shape: &onnxpb.TensorShapeProto{Dim: ds}}}}}
}

func nodeOf(op string, ins, outs []string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{OpType: proto.String(op), Input: ins, Output: outs, Name: proto.String(strings.ToLower(op) + "_" + outs[0]), Attribute: attrs}
}

func intsAttr(name string, v ...int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_INTS.Enum(), Ints: v}
}

func intAttr(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_INT.Enum(), I: proto.Int64(v)}
}

func floatInit(name string, dims []int64, vals ...float32) *onnxpb.TensorProto {
	raw := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	return &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(onnxpb.TensorProto_FLOAT)), Dims: dims, RawData: raw}
}

func int64Init(name string, vals ...int64) *onnxpb.TensorProto {
	return &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(onnxpb.TensorProto_INT64)), Dims: []int64{int64(len(vals))}, Int64Data: vals}
}

func model(opset int64, g *onnxpb.GraphProto) *onnxpb.ModelProto {
	return &onnxpb.ModelProto{IrVersion: proto.Int64(8), Graph: g,
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}}}
}

func marshal(t testing.TB, m *onnxpb.ModelProto) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	check.NoError(t, err)
	return b
}

// linearModel is y = relu(x·Wᵀ + b) as PyTorch exports nn.Linear + ReLU
// (Gemm transB=1), x of shape [N, 3] with a symbolic batch.
func linearModel() *onnxpb.ModelProto {
	return model(13, &onnxpb.GraphProto{
		Name:  proto.String("linear"),
		Input: []*onnxpb.ValueInfoProto{vinfo("x", onnxpb.TensorProto_FLOAT, "N", 3)},
		Initializer: []*onnxpb.TensorProto{
			floatInit("fc.weight", []int64{2, 3}, 1, 2, 3, -1, -2, -3),
			floatInit("fc.bias", []int64{2}, 0.5, 0.25),
		},
		Node: []*onnxpb.NodeProto{
			nodeOf("Gemm", []string{"x", "fc.weight", "fc.bias"}, []string{"h"}, intAttr("transB", 1)),
			nodeOf("Relu", []string{"h"}, []string{"y"}),
		},
		Output: []*onnxpb.ValueInfoProto{vinfo("y", onnxpb.TensorProto_FLOAT, "N", 2)},
	})
}

func TestReadErrors(t *testing.T) {
	good := marshal(t, linearModel())
	mutate := func(f func(m *onnxpb.ModelProto)) []byte {
		m := linearModel()
		f(m)
		return marshal(t, m)
	}
	for _, tc := range []struct {
		name string
		data []byte
		want []string
	}{
		{"truncated", good[:len(good)/2], []string{"not an ONNX model"}},
		{"not onnx", []byte("this is a text file, not a model\n"), []string{"not an ONNX model"}},
		{"empty", nil, []string{"not an ONNX model", "no ir_version"}},
		{"opset too new", mutate(func(m *onnxpb.ModelProto) { m.OpsetImport[0].Version = proto.Int64(99) }),
			[]string{"opset 99 is newer than kiln knows (1–21)"}},
		{"opset too old", mutate(func(m *onnxpb.ModelProto) { m.OpsetImport[0].Version = proto.Int64(-1) }),
			[]string{"opset -1 is older than kiln imports (1–21)"}},
		{"dangling input", mutate(func(m *onnxpb.ModelProto) { m.Graph.Node[1].Input[0] = "nowhere" }),
			[]string{`node "relu_y" (Relu)`, `input "nowhere" is not a graph input`}},
		{"cycle", mutate(func(m *onnxpb.ModelProto) {
			m.Graph.Node[0].Input[0] = "y"
		}), []string{"cycle", `node "gemm_h" (Gemm)`, `node "relu_y" (Relu)`}},
		{"initializer length", mutate(func(m *onnxpb.ModelProto) {
			m.Graph.Initializer[0].RawData = m.Graph.Initializer[0].RawData[:20]
		}), []string{`tensor "fc.weight"`, "raw_data has 20 bytes; dims [2 3] of float32 need 24"}},
		{"typed length", mutate(func(m *onnxpb.ModelProto) {
			m.Graph.Initializer[1] = int64Init("fc.bias", 1, 2, 3)
			m.Graph.Initializer[1].Dims = []int64{2}
		}), []string{`tensor "fc.bias"`, "int64_data has 3 values; dims [2] need 2"}},
		{"produced twice", mutate(func(m *onnxpb.ModelProto) { m.Graph.Node[1].Output[0] = "h" }),
			[]string{`output "h" is also produced by node "gemm_h"`}},
		{"missing output", mutate(func(m *onnxpb.ModelProto) { m.Graph.Output[0].Name = proto.String("z") }),
			[]string{`graph output "z" is produced by no node`}},
		{"external outside", mutate(func(m *onnxpb.ModelProto) {
			w := m.Graph.Initializer[0]
			w.RawData = nil
			w.DataLocation = onnxpb.TensorProto_EXTERNAL.Enum()
			w.ExternalData = []*onnxpb.StringStringEntryProto{{Key: proto.String("location"), Value: proto.String("../../etc/passwd")}}
		}), []string{`tensor "fc.weight"`, "leaves the model's directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(tc.data, t.TempDir())
			check.Error(t, err, tc.want...)
		})
	}
}

func TestExternalData(t *testing.T) {
	dir := t.TempDir()
	m := linearModel()
	w := m.Graph.Initializer[0]
	data := append(make([]byte, 8), w.RawData...) // at offset 8
	check.NoError(t, os.WriteFile(filepath.Join(dir, "weights.bin"), data, 0o644))
	w.RawData = nil
	w.DataLocation = onnxpb.TensorProto_EXTERNAL.Enum()
	w.ExternalData = []*onnxpb.StringStringEntryProto{
		{Key: proto.String("location"), Value: proto.String("weights.bin")},
		{Key: proto.String("offset"), Value: proto.String("8")},
		{Key: proto.String("length"), Value: proto.String("24")},
	}
	path := filepath.Join(dir, "model.onnx")
	check.NoError(t, os.WriteFile(path, marshal(t, m), 0o644))
	got, err := ReadFile(path)
	check.NoError(t, err)
	check.Equal(t, got.Initializers["fc.weight"].Floats(), []float64{1, 2, 3, -1, -2, -3})

	w.ExternalData[2].Value = proto.String("28")
	check.NoError(t, os.WriteFile(path, marshal(t, m), 0o644))
	_, err = ReadFile(path)
	check.Error(t, err, `tensor "fc.weight"`, `external data "weights.bin" holds 28 bytes; the dims need 24`)
	_, err = Read(marshal(t, m), "")
	check.Error(t, err, "not read from a file")
}

// FuzzReadModel feeds arbitrary bytes to the reader and the importer:
// they may refuse them but must not panic. The corpus in
// testdata/fuzz/FuzzReadModel holds the linear model and its mutations.
func FuzzReadModel(f *testing.F) {
	f.Add(marshal(f, linearModel()))
	static := linearModel()
	static.Graph.Input[0] = vinfo("x", onnxpb.TensorProto_FLOAT, 1, 3)
	f.Add(marshal(f, static))
	f.Add([]byte{0x08, 0x07})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Read(b, "")
		if err != nil {
			return
		}
		_, _, _ = Import(m, Options{InputShapes: map[string][]int64{}})
	})
}
