package onnx

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// oneNode imports a model of one node over float inputs of the given
// shapes (named a, b, c…) and initializers, with outputs y0, y1….
func oneNode(t *testing.T, opset int64, op string, shapes [][]any, inits []*onnxpb.TensorProto, nOut int, attrs ...*onnxpb.AttributeProto) (*ir.Function, error) {
	t.Helper()
	var ins []*onnxpb.ValueInfoProto
	var names []string
	for i, s := range shapes {
		name := string(rune('a' + i))
		ins = append(ins, vinfo(name, onnxpb.TensorProto_FLOAT, s...))
		names = append(names, name)
	}
	for _, in := range inits {
		names = append(names, in.GetName())
	}
	var outs []string
	var outInfo []*onnxpb.ValueInfoProto
	for i := range nOut {
		o := "y" + string(rune('0'+i))
		outs = append(outs, o)
		outInfo = append(outInfo, &onnxpb.ValueInfoProto{Name: proto.String(o)})
	}
	pm := model(opset, &onnxpb.GraphProto{Name: proto.String("g"), Input: ins, Initializer: inits,
		Node: []*onnxpb.NodeProto{nodeOf(op, names, outs, attrs...)}, Output: outInfo})
	mod, _, err := Import(readModel(t, pm), Options{})
	if err != nil {
		return nil, err
	}
	f, _ := mod.Lookup("main")
	return f.(*ir.Function), nil
}

// outShapes returns the shapes of f's outputs.
func outShapes(f *ir.Function) [][]int64 {
	var out [][]int64
	switch si := f.Body.Body.(*ir.RVar).Info.(type) {
	case *ir.TensorStructInfo:
		s, _ := si.KnownShape()
		out = append(out, s)
	case *ir.TupleStructInfo:
		for _, fi := range si.Fields {
			s, _ := fi.(*ir.TensorStructInfo).KnownShape()
			out = append(out, s)
		}
	}
	return out
}

// constOut returns f's single output when it was computed at import.
func constOut(t *testing.T, f *ir.Function) *Tensor {
	t.Helper()
	bs := f.Body.Blocks[0].Bindings
	c, ok := bs[len(bs)-1].BoundValue().(*ir.Constant)
	check.True(t, ok, "the output is a constant")
	return &Tensor{DType: c.DType, Shape: []int64(c.Shape), Data: c.Data}
}

func strAttr(name, v string) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_STRING.Enum(), S: []byte(v)}
}

func TestTopKAndEinsum(t *testing.T) {
	f, err := oneNode(t, 11, "TopK", [][]any{{3, 5}}, []*onnxpb.TensorProto{int64Init("k", 2)}, 2)
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{3, 2}, {3, 2}})
	_, err = oneNode(t, 11, "TopK", [][]any{{3, 5}}, []*onnxpb.TensorProto{int64Init("k", 6)}, 2)
	check.Error(t, err, "K = 6 for an axis of 5 elements")

	for _, c := range []struct {
		eq     string
		shapes [][]any
		want   []int64
	}{
		{"ij,jk->ik", [][]any{{2, 3}, {3, 4}}, []int64{2, 4}},
		{"bij,bjk->bik", [][]any{{5, 2, 3}, {5, 3, 4}}, []int64{5, 2, 4}},
		{"bij,bjk", [][]any{{5, 2, 3}, {5, 3, 4}}, []int64{2, 4}}, // implicit: the subscripts used once
		{"...ii->...i", [][]any{{3, 4, 4}}, []int64{3, 4}},
		{"i,i", [][]any{{4}, {4}}, []int64{}},
		{"ij->ji", [][]any{{2, 3}}, []int64{3, 2}},
	} {
		f, err := oneNode(t, 12, "Einsum", c.shapes, nil, 1, strAttr("equation", c.eq))
		check.NoError(t, err, c.eq)
		check.Equal(t, outShapes(f), [][]int64{c.want}, c.eq)
	}
	_, err = oneNode(t, 12, "Einsum", [][]any{{2, 3}}, nil, 1, strAttr("equation", "ij,jk->ik"))
	check.Error(t, err, `equation "ij,jk->ik": 2 terms for 1 inputs`)
	_, err = oneNode(t, 12, "Einsum", [][]any{{2, 3}, {4, 5}}, nil, 1, strAttr("equation", "ij,jk->ik"))
	check.Error(t, err, `subscript 'j' is 3 in one place and 4 in another`)
}

// TestDataDependentOps checks the operators computed at import from
// known inputs, and the error naming the input when it is not known.
func TestDataDependentOps(t *testing.T) {
	x := floatInit("x", []int64{2, 3}, 0, 2, 0, 1, 0, 5)
	f, err := oneNode(t, 13, "NonZero", nil, []*onnxpb.TensorProto{x}, 1)
	check.NoError(t, err)
	check.Equal(t, constOut(t, f).Ints(), []int64{0, 1, 1, 1, 0, 2})

	_, err = oneNode(t, 13, "NonZero", [][]any{{2, 3}}, nil, 1)
	check.ErrorIs(t, err, ErrNeedsKnown)
	check.Error(t, err, `the value "a"`, "decide the output's shape")

	u := hostUnique(intTensor([]int64{3, 1, 3, 2, 1}), -1, true)
	check.Equal(t, u[0].c.Ints(), []int64{1, 2, 3})
	check.Equal(t, u[1].c.Ints(), []int64{1, 3, 0}) // first appearances
	check.Equal(t, u[2].c.Ints(), []int64{2, 0, 2, 1, 0})
	check.Equal(t, u[3].c.Ints(), []int64{2, 1, 2})
	u = hostUnique(intTensor([]int64{3, 1, 3, 2, 1}), -1, false)
	check.Equal(t, u[0].c.Ints(), []int64{3, 1, 2})

	// Two overlapping boxes of one class (IoU 0.81) and one apart: the
	// weaker overlapping one is suppressed.
	boxes := floatInit("boxes", []int64{1, 3, 4}, 0, 0, 1, 1, 0, 0.1, 1, 1.1, 0, 5, 1, 6)
	scores := floatInit("scores", []int64{1, 1, 3}, 0.9, 0.8, 0.7)
	iou := floatInit("iou", []int64{1}, 0.5)
	f, err = oneNode(t, 11, "NonMaxSuppression", nil, []*onnxpb.TensorProto{boxes, scores, int64Init("max", 3), iou}, 1)
	check.NoError(t, err)
	check.Equal(t, constOut(t, f).Ints(), []int64{0, 0, 0, 0, 0, 2})
}

func TestWindowsAndDFT(t *testing.T) {
	size := &onnxpb.TensorProto{Name: proto.String("n"), DataType: proto.Int32(int32(onnxpb.TensorProto_INT64)), Int64Data: []int64{4}}
	f, err := oneNode(t, 17, "HannWindow", nil, []*onnxpb.TensorProto{size}, 1)
	check.NoError(t, err)
	got := constOut(t, f).Floats()
	for i, want := range []float64{0, 0.5, 1, 0.5} {
		check.True(t, math.Abs(got[i]-want) < 1e-6, "hann[%d] = %g, want %g", i, got[i], want)
	}
	f, err = oneNode(t, 17, "DFT", [][]any{{2, 8, 1}}, nil, 1, intAttr("onesided", 1))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{2, 5, 2}})
	_, err = oneNode(t, 17, "DFT", [][]any{{2, 8, 3}}, nil, 1)
	check.Error(t, err, "whose last axis holds 1 (real) or 2 (complex) values")
}

func TestRecurrentImports(t *testing.T) {
	// LSTM, bidirectional: X [S=3, B=2, I=4], hidden 5.
	f, err := oneNode(t, 14, "LSTM", [][]any{{3, 2, 4}, {2, 20, 4}, {2, 20, 5}}, nil, 3,
		intAttr("hidden_size", 5), strAttr("direction", "bidirectional"))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{3, 2, 2, 5}, {2, 2, 5}, {2, 2, 5}})
	f, err = oneNode(t, 14, "GRU", [][]any{{2, 3, 4}, {1, 15, 4}, {1, 15, 5}}, nil, 2, intAttr("hidden_size", 5), intAttr("layout", 1))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{2, 3, 1, 5}, {2, 1, 5}})
	_, err = oneNode(t, 14, "RNN", [][]any{{3, 2, 4}, {1, 5, 4}, {1, 5, 5}}, nil, 2, strAttr("direction", "sideways"))
	check.Error(t, err, `direction "sideways" is not forward, reverse or bidirectional`)
	acts := &onnxpb.AttributeProto{Name: proto.String("activations"), Type: onnxpb.AttributeProto_STRINGS.Enum(), Strings: [][]byte{[]byte("Swish")}}
	_, err = oneNode(t, 14, "RNN", [][]any{{3, 2, 4}, {1, 5, 4}, {1, 5, 5}}, nil, 2, acts)
	check.ErrorIs(t, err, ErrUnsupported)
	check.Error(t, err, `recurrent activation "Swish"`)
}

func TestImportErrorsNameTheProblem(t *testing.T) {
	_, err := oneNode(t, 16, "GridSample", [][]any{{1, 1, 2, 3, 3}, {1, 2, 3, 3, 3}}, nil, 1)
	check.ErrorIs(t, err, ErrUnsupported)
	check.Error(t, err, "GridSample of float32[1 1 2 3 3]")
	_, err = oneNode(t, 13, "Pad", [][]any{{2, 3}}, []*onnxpb.TensorProto{int64Init("p", 1, 1, 1, 1)}, 1, strAttr("mode", "mirror"))
	check.Error(t, err, `Pad mode "mirror" is not one of constant, edge, reflect, wrap`)
	_, err = oneNode(t, 13, "Pad", [][]any{{1, 3}}, []*onnxpb.TensorProto{int64Init("p", 1, 0, 1, 0)}, 1, strAttr("mode", "reflect"))
	check.Error(t, err, `Pad mode "reflect" of an axis of 1 elements`)
	f, err := oneNode(t, 13, "Pad", [][]any{{2, 3}}, []*onnxpb.TensorProto{int64Init("p", 1, 2, 0, 1)}, 1, strAttr("mode", "edge"))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{3, 6}})

	zp := &onnxpb.TensorProto{Name: proto.String("zp"), DataType: proto.Int32(int32(onnxpb.TensorProto_INT16)), Int32Data: []int32{0}}
	sc := floatInit("sc", nil, 0.5)
	_, err = oneNode(t, 13, "QuantizeLinear", [][]any{{4}}, []*onnxpb.TensorProto{sc, zp}, 1)
	check.ErrorIs(t, err, ErrUnsupported)
	check.Error(t, err, "quantizing to int16")

	f, err = oneNode(t, 18, "ReduceProd", [][]any{{3, 5, 2}}, []*onnxpb.TensorProto{int64Init("ax", 1)}, 1, intAttr("keepdims", 0))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{3, 2}})
}

func TestDetAndControlFlow(t *testing.T) {
	ps := permutations(3)
	odd := 0
	for _, p := range ps {
		if p.odd {
			odd++
		}
	}
	check.Equal(t, len(ps), 6)
	check.Equal(t, odd, 3)
	f, err := oneNode(t, 11, "Det", [][]any{{2, 3, 3}}, nil, 1)
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{2}})
	_, err = oneNode(t, 11, "Det", [][]any{{7, 7}}, nil, 1)
	check.ErrorIs(t, err, ErrUnsupported)
	check.Error(t, err, "Det of 7×7 matrices")

	// If with a condition known at import imports only its branch.
	branch := func(v float32) *onnxpb.AttributeProto {
		return &onnxpb.AttributeProto{Type: onnxpb.AttributeProto_GRAPH.Enum(), G: &onnxpb.GraphProto{
			Name:        proto.String("b"),
			Initializer: []*onnxpb.TensorProto{floatInit("k", []int64{2}, v, v)},
			Node:        []*onnxpb.NodeProto{nodeOf("Identity", []string{"k"}, []string{"out"})},
			Output:      []*onnxpb.ValueInfoProto{{Name: proto.String("out")}},
		}}
	}
	then, els := branch(1), branch(2)
	then.Name, els.Name = proto.String("then_branch"), proto.String("else_branch")
	cond := &onnxpb.TensorProto{Name: proto.String("c"), DataType: proto.Int32(int32(onnxpb.TensorProto_BOOL)), Int32Data: []int32{0}}
	f, err = oneNode(t, 13, "If", nil, []*onnxpb.TensorProto{cond}, 1, then, els)
	check.NoError(t, err)
	check.Equal(t, constOut(t, f).Floats(), []float64{2, 2})
}

func TestPoolingAndTfIdfImports(t *testing.T) {
	f, err := oneNode(t, 12, "MaxPool", [][]any{{1, 2, 4, 4, 4}}, nil, 2, intsAttr("kernel_shape", 2, 2, 2), intsAttr("strides", 2, 2, 2))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{1, 2, 2, 2, 2}, {1, 2, 2, 2, 2}})
	f, err = oneNode(t, 11, "AveragePool", [][]any{{1, 1, 3, 3, 3}}, nil, 1, intsAttr("kernel_shape", 2, 2, 2), intsAttr("pads", 1, 1, 1, 1, 1, 1))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{1, 1, 4, 4, 4}})
	_, err = oneNode(t, 11, "AveragePool", [][]any{{1, 1, 3, 3, 3}}, nil, 1, intsAttr("kernel_shape", 2, 2, 2), intAttr("ceil_mode", 1))
	check.ErrorIs(t, err, ErrUnsupported)

	tf := func(attrs ...*onnxpb.AttributeProto) (*ir.Function, error) {
		pm := model(9, &onnxpb.GraphProto{Name: proto.String("g"),
			Input:  []*onnxpb.ValueInfoProto{vinfo("x", onnxpb.TensorProto_INT32, 2, 6)},
			Node:   []*onnxpb.NodeProto{nodeOf("TfIdfVectorizer", []string{"x"}, []string{"y"}, attrs...)},
			Output: []*onnxpb.ValueInfoProto{{Name: proto.String("y")}}})
		mod, _, err := Import(readModel(t, pm), Options{})
		if err != nil {
			return nil, err
		}
		fn, _ := mod.Lookup("main")
		return fn.(*ir.Function), nil
	}
	f, err = tf(strAttr("mode", "TF"), intAttr("min_gram_length", 1), intAttr("max_gram_length", 2), intAttr("max_skip_count", 1),
		intsAttr("ngram_counts", 0, 2), intsAttr("ngram_indexes", 0, 1, 2), intsAttr("pool_int64s", 4, 5, 7, 8))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{2, 3}})
	_, err = tf(strAttr("mode", "TF"), intAttr("max_gram_length", 2), intsAttr("ngram_counts", 0, 2), intsAttr("ngram_indexes", 0, 1, 2), intsAttr("pool_int64s", 4, 5, 7, 8, 9))
	check.Error(t, err, "ngram_counts [0 2] do not fit a pool of 5 tokens")
}

func TestRoiAlignAndCropResize(t *testing.T) {
	rois := floatInit("rois", []int64{2, 4}, 0, 0, 3, 3, 1, 1, 2, 2)
	bi := int64Init("bi", 0, 0)
	f, err := oneNode(t, 16, "RoiAlign", [][]any{{1, 3, 4, 4}}, []*onnxpb.TensorProto{rois, bi}, 1, intAttr("output_height", 2), intAttr("output_width", 2))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{2, 3, 2, 2}})
	_, err = oneNode(t, 16, "RoiAlign", [][]any{{1, 3, 4, 4}}, []*onnxpb.TensorProto{rois, bi}, 1, strAttr("mode", "max"))
	check.ErrorIs(t, err, ErrUnsupported)
	check.Error(t, err, `RoiAlign mode "max"`)

	w := bilinearTaps
	sum := 0.0
	w(1.25, 2.5, 4, 4, func(_, _ int64, v float64) { sum += v })
	check.True(t, math.Abs(sum-1) < 1e-12, "bilinear weights sum to %g", sum)
	n := 0
	w(-3, 0, 4, 4, func(_, _ int64, _ float64) { n++ })
	check.Equal(t, n, 0)

	roi := floatInit("roi", []int64{8}, 0, 0, 0.4, 0.6, 1, 1, 0.6, 0.8)
	scales := floatInit("scales", []int64{0})
	sizes := int64Init("sizes", 1, 1, 3, 3)
	f, err = oneNode(t, 13, "Resize", [][]any{{1, 1, 4, 4}}, []*onnxpb.TensorProto{roi, scales, sizes}, 1,
		strAttr("coordinate_transformation_mode", "tf_crop_and_resize"), strAttr("mode", "linear"))
	check.NoError(t, err)
	check.Equal(t, outShapes(f), [][]int64{{1, 1, 3, 3}})
}

// TestNewOperatorsNeverPanic imports each operator over inputs of odd
// ranks and counts: an error is fine, a panic is not.
func TestNewOperatorsNeverPanic(t *testing.T) {
	ops := []struct {
		op    string
		opset int64
	}{
		{"TopK", 11}, {"Einsum", 12}, {"NonZero", 13}, {"Unique", 11}, {"Compress", 11}, {"NonMaxSuppression", 11},
		{"HannWindow", 17}, {"MelWeightMatrix", 17}, {"RNN", 14}, {"GRU", 14}, {"LSTM", 14}, {"QuantizeLinear", 13},
		{"DequantizeLinear", 13}, {"DynamicQuantizeLinear", 11}, {"MatMulInteger", 10}, {"ConvInteger", 10},
		{"QLinearMatMul", 10}, {"QLinearConv", 10}, {"ReverseSequence", 10}, {"MaxUnpool", 11}, {"DFT", 17},
		{"STFT", 17}, {"GridSample", 16}, {"Det", 11}, {"LRN", 13}, {"MeanVarianceNormalization", 13},
		{"Celu", 12}, {"Upsample", 9}, {"TfIdfVectorizer", 9}, {"RoiAlign", 16}, {"ReduceProd", 18},
		{"BatchNormalization", 15}, {"MaxPool", 12}, {"AveragePool", 11}, {"If", 13}, {"Loop", 13}, {"Scan", 11},
	}
	shapes := [][]any{{}, {1}, {2, 3}, {1, 2, 3, 3, 3}}
	for _, o := range ops {
		for _, s := range shapes {
			for _, k := range []int{1, 2, 3, 5, 8} {
				ins := make([][]any, k)
				for i := range ins {
					ins[i] = s
				}
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Errorf("%s over %d inputs of shape %v panics: %v", o.op, k, s, r)
						}
					}()
					_, _ = oneNode(t, o.opset, o.op, ins, nil, 1, intAttr("training_mode", 1))
				}()
			}
		}
	}
}
