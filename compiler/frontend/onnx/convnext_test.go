package onnx

import (
	"context"
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// cnBlock is the block of torchvision's ConvNeXt as PyTorch exports it at
// opset 13: a 7×7 depthwise convolution, permute(0, 2, 3, 1), LayerNorm
// over the channels (decomposed: ReduceMean, Sub, Pow, ReduceMean, Add,
// Sqrt, Div, Mul, Add), Linear (MatMul + Add), GELU (Div, Erf, Add, Mul,
// Mul), Linear, permute back, the layer scale (a [C, 1, 1] weight) and
// the residual add. w holds its weights by name.
type cnBlock struct {
	N, C, H, W, E int
	w             map[string][]float32
	// fused: LayerNormalization (opset 17) in place of its decomposition.
	fused bool
	// shared: the layer norm's bias is the convolution's, read through
	// an Identity node (PyTorch's exporter keeps one of equal
	// initializers), so one weight is read as [C] and as [1, C, 1, 1].
	shared bool
}

func newCNBlock(n, c, h, w, e int) *cnBlock {
	b := &cnBlock{N: n, C: c, H: h, W: w, E: e, w: map[string][]float32{}}
	fill := func(name string, count int, scale float32) {
		v := make([]float32, count)
		for i := range v {
			v[i] = scale * float32((i*7+len(name))%11-5) / 5
		}
		b.w[name] = v
	}
	fill("dw.w", c*49, 0.2)
	fill("dw.b", c, 0.1)
	fill("ln.w", c, 1)
	fill("ln.b", c, 0.1)
	fill("fc1.w", c*e, 0.3)
	fill("fc1.b", e, 0.1)
	fill("fc2.w", e*c, 0.3)
	fill("fc2.b", c, 0.1)
	fill("gamma", c, 0.5)
	return b
}

func (b *cnBlock) model() *onnxpb.ModelProto {
	N, C, H, W, E := b.N, b.C, b.H, b.W, b.E
	init := func(name string, dims ...int64) *onnxpb.TensorProto { return floatInit(name, dims, b.w[name]...) }
	norm := []*onnxpb.NodeProto{
		nodeOf("ReduceMean", []string{"t"}, []string{"mu"}, intsAttr("axes", -1)),
		nodeOf("Sub", []string{"t", "mu"}, []string{"dv"}),
		nodeOf("Pow", []string{"dv", "two"}, []string{"dv2"}),
		nodeOf("ReduceMean", []string{"dv2"}, []string{"var"}, intsAttr("axes", -1)),
		nodeOf("Add", []string{"var", "eps"}, []string{"ve"}),
		nodeOf("Sqrt", []string{"ve"}, []string{"sd"}),
		nodeOf("Div", []string{"dv", "sd"}, []string{"nrm"}),
		nodeOf("Mul", []string{"nrm", "ln.w"}, []string{"nw"}),
		nodeOf("Add", []string{"nw", "ln.b"}, []string{"ln"}),
	}
	opset := int64(13)
	if b.fused {
		opset = 17
		norm = []*onnxpb.NodeProto{nodeOf("LayerNormalization", []string{"t", "ln.w", "ln.b"}, []string{"ln"}, intAttr("axis", -1), floatAttr("epsilon", 1e-6))}
	}
	inits := []*onnxpb.TensorProto{init("ln.b", int64(C))}
	var nodes []*onnxpb.NodeProto
	if b.shared {
		inits = nil
		nodes = append(nodes, nodeOf("Identity", []string{"dw.b"}, []string{"ln.b"}))
	}
	nodes = append(nodes,
		nodeOf("Conv", []string{"x", "dw.w", "dw.b"}, []string{"c"}, intAttr("group", int64(C)), intsAttr("kernel_shape", 7, 7), intsAttr("pads", 3, 3, 3, 3)),
		nodeOf("Transpose", []string{"c"}, []string{"t"}, intsAttr("perm", 0, 2, 3, 1)),
	)
	nodes = append(nodes, norm...)
	nodes = append(nodes,
		nodeOf("Transpose", []string{"fc1.wt"}, []string{"fc1.w"}, intsAttr("perm", 1, 0)),
		nodeOf("MatMul", []string{"ln", "fc1.w"}, []string{"m1"}),
		nodeOf("Add", []string{"fc1.b", "m1"}, []string{"a1"}),
		nodeOf("Div", []string{"a1", "sqrt2"}, []string{"d"}),
		nodeOf("Erf", []string{"d"}, []string{"e"}),
		nodeOf("Add", []string{"e", "one"}, []string{"e1"}),
		nodeOf("Mul", []string{"a1", "e1"}, []string{"g0"}),
		nodeOf("Mul", []string{"g0", "half"}, []string{"g"}),
		nodeOf("MatMul", []string{"g", "fc2.w"}, []string{"m2"}),
		nodeOf("Add", []string{"fc2.b", "m2"}, []string{"a2"}),
		nodeOf("Transpose", []string{"a2"}, []string{"p"}, intsAttr("perm", 0, 3, 1, 2)),
		nodeOf("Mul", []string{"gamma", "p"}, []string{"s"}),
		nodeOf("Add", []string{"s", "x"}, []string{"y"}),
	)
	return model(opset, &onnxpb.GraphProto{
		Name:  proto.String("cnblock"),
		Input: []*onnxpb.ValueInfoProto{vinfo("x", onnxpb.TensorProto_FLOAT, N, C, H, W)},
		Initializer: append(inits,
			init("dw.w", int64(C), 1, 7, 7), init("dw.b", int64(C)), init("ln.w", int64(C)),
			floatInit("fc1.wt", []int64{int64(E), int64(C)}, b.transposed("fc1.w", C, E)...), init("fc1.b", int64(E)), init("fc2.w", int64(E), int64(C)), init("fc2.b", int64(C)),
			init("gamma", int64(C), 1, 1),
			floatInit("two", nil, 2), floatInit("eps", nil, 1e-6),
			floatInit("sqrt2", nil, 1.4142135), floatInit("one", nil, 1), floatInit("half", nil, 0.5),
		),
		Node:   nodes,
		Output: []*onnxpb.ValueInfoProto{vinfo("y", onnxpb.TensorProto_FLOAT, N, C, H, W)},
	})
}

// reference computes the block on x (NCHW) in float64.
func (b *cnBlock) reference(x []float32) []float64 {
	N, C, H, W, E := b.N, b.C, b.H, b.W, b.E
	w := b.w
	y := make([]float64, len(x))
	for n := range N {
		for h := range H {
			for ww := range W {
				t := make([]float64, C)
				for c := range C {
					s := float64(w["dw.b"][c])
					for kh := range 7 {
						for kw := range 7 {
							ih, iw := h+kh-3, ww+kw-3
							if ih >= 0 && ih < H && iw >= 0 && iw < W {
								s += float64(x[((n*C+c)*H+ih)*W+iw]) * float64(w["dw.w"][(c*7+kh)*7+kw])
							}
						}
					}
					t[c] = s
				}
				mu, vr := 0.0, 0.0
				for _, v := range t {
					mu += v
				}
				mu /= float64(C)
				for _, v := range t {
					vr += (v - mu) * (v - mu)
				}
				vr /= float64(C)
				for c := range t {
					t[c] = (t[c]-mu)/math.Sqrt(vr+1e-6)*float64(w["ln.w"][c]) + float64(w["ln.b"][c])
				}
				g := make([]float64, E)
				for e := range E {
					s := float64(w["fc1.b"][e])
					for c := range C {
						s += t[c] * float64(w["fc1.w"][c*E+e])
					}
					g[e] = 0.5 * s * (1 + math.Erf(s/math.Sqrt2))
				}
				for c := range C {
					s := float64(w["fc2.b"][c])
					for e := range E {
						s += g[e] * float64(w["fc2.w"][e*C+c])
					}
					i := ((n*C+c)*H+h)*W + ww
					y[i] = float64(w["gamma"][c])*s + float64(x[i])
				}
			}
		}
	}
	return y
}

// TestConvNeXtBlock imports, builds and runs ConvNeXt's block (see
// cnBlock) and compares its output with a reference computed here, on
// channel counts the CPU's vectors divide and on odd ones, with the layer
// norm's bias its own weight and the convolution's.
func TestConvNeXtBlock(t *testing.T) {
	for i, sh := range [][5]int{{1, 32, 7, 7, 128}, {2, 8, 5, 6, 32}, {1, 12, 3, 9, 20}, {1, 16, 1, 1, 64}, {1, 192, 3, 2, 768}} {
		b := newCNBlock(sh[0], sh[1], sh[2], sh[3], sh[4])
		b.fused = i%2 == 1
		if b.shared = i%2 == 0; b.shared {
			b.w["ln.b"] = b.w["dw.b"]
		}
		mod, ps, err := Import(readModel(t, b.model()), Options{})
		check.NoError(t, err, "import %v", sh)
		a, err := compiler.Build(context.Background(), mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{NoCache: true})
		check.NoError(t, err, "build %v", sh)
		x := make([]float32, b.N*b.C*b.H*b.W)
		for i := range x {
			x[i] = float32((i*13)%17-8) / 8
		}
		got := runGraph(t, a, mod, ps, x, []int64{int64(b.N), int64(b.C), int64(b.H), int64(b.W)})
		want := b.reference(x)
		check.Equal(t, len(got), len(want))
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-4+1e-4*math.Abs(want[i]) {
				t.Fatalf("shape %v: element %d is %g, want %g", sh, i, got[i], want[i])
			}
		}
	}
}

// runGraph runs the main function of artifact a (built from mod, whose
// weights are ps) on input x of the given shape and returns its output.
func runGraph(t *testing.T, a *artifact.Artifact, mod *ir.IRModule, ps *Params, x []float32, shape []int64) []float64 {
	t.Helper()
	kmod, err := cpu.LoadArtifact(a, t.TempDir())
	check.NoError(t, err)
	exe, err := vm.Unmarshal(a.Files[artifact.VMExec])
	check.NoError(t, err)
	m, err := vm.New(exe, kmod, devices.CPUDevice, vm.Options{})
	check.NoError(t, err)
	defer m.Close()
	in := newTensor(ir.Float32, shape)
	for i, v := range x {
		setElem(in.Data, ir.Float32, i, float64(v))
	}
	arr, err := in.NDArray(devices.CPUDevice)
	check.NoError(t, err)
	args := []packedfunc.Value{packedfunc.Array(arr)}
	weights, err := ps.NDArrays(devices.CPUDevice)
	check.NoError(t, err)
	f, _ := mod.Lookup("main")
	for _, p := range f.(*ir.Function).Params[1:] {
		w, ok := weights[p.Name]
		check.True(t, ok, "weight %q", p.Name)
		args = append(args, packedfunc.Array(w))
	}
	out, err := m.Invoke("main", args...)
	check.NoError(t, err)
	p, err := out.Packed()
	check.NoError(t, err)
	res, err := p.AsArray()
	check.NoError(t, err)
	check.Equal(t, res.DType(), ndarray.Float32)
	data, err := res.Bytes()
	check.NoError(t, err)
	got := (&Tensor{DType: ir.Float32, Shape: shape, Data: data}).Floats()
	return got
}

func floatAttr(name string, v float32) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_FLOAT.Enum(), F: proto.Float32(v)}
}

// transposed returns weight name, of shape [rows, cols], transposed.
func (b *cnBlock) transposed(name string, rows, cols int) []float32 {
	w := b.w[name]
	out := make([]float32, len(w))
	for r := range rows {
		for c := range cols {
			out[c*rows+r] = w[r*cols+c]
		}
	}
	return out
}
