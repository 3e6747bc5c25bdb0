package onnx

import (
	"errors"
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// ErrUnsupported is returned (wrapped) for a node whose operator, opset
// or attributes kiln does not import.
var ErrUnsupported = errors.New("unsupported operator")

// ErrNeedsKnown is returned (wrapped, with ErrUnsupported) when an input
// that kiln needs at import time (a shape, axes, pads) is computed at run
// time; Options.Known can fix the graph inputs it comes from.
var ErrNeedsKnown = errors.New("needs a value known at import time")

// NeedsKnownError names the value that had to be known at import time.
type NeedsKnownError struct {
	Value string // the ONNX value's name
	what  string
}

func (e *NeedsKnownError) Error() string {
	return fmt.Sprintf("%v: %s, the value %q, is computed at run time; kiln needs it known at import time (a model input can be fixed with Options.Known)",
		ErrUnsupported, e.what, e.Value)
}

// Is makes the error match ErrUnsupported and ErrNeedsKnown.
func (e *NeedsKnownError) Is(target error) bool {
	return target == ErrUnsupported || target == ErrNeedsKnown
}

type convertFn func(im *importer, n *node) ([]*value, error)

// converter converts one op type, from opset since on.
type converter struct {
	since int64
	fn    convertFn
}

var converters = map[string]converter{}

func reg(opType string, since int64, fn convertFn) { converters[opType] = converter{since, fn} }

// sameAsOpset7 names, for models older than opset 7, the operators whose
// definition from the given opset on computes what opset 7's does, so
// that opset 7's converter imports them. (Opset 1's consumed_inputs
// attribute was a memory hint, dropped in opset 6 without changing the
// result.) Operators left out changed meaning: the binary arithmetic
// and logic operators broadcast only with broadcast=1 before opset 7,
// Dropout and BatchNormalization had is_test, Gemm had broadcast.
var sameAsOpset7 = map[string]int64{
	"Relu": 1, "Sigmoid": 1, "Tanh": 1, "Exp": 1, "Log": 1, "Sqrt": 1, "Neg": 1, "Abs": 1, "Floor": 1,
	"Ceil": 1, "Reciprocal": 1, "Elu": 1, "Selu": 1, "HardSigmoid": 1, "LeakyRelu": 1, "Softplus": 1,
	"Softsign": 1, "Not": 1, "Identity": 1, "GlobalAveragePool": 1, "GlobalMaxPool": 1,
	"InstanceNormalization": 1, "Transpose": 1, "Softmax": 1, "LogSoftmax": 1, "Flatten": 1,
	"Squeeze": 1, "Unsqueeze": 1, "Shape": 1, "Size": 1, "Gather": 1, "MatMul": 1, "Constant": 1,
	"Conv": 1, "MaxPool": 1, "AveragePool": 1, "ReduceMean": 1, "ReduceSum": 1, "ReduceMax": 1,
	"ReduceMin": 1, "ArgMax": 1, "ArgMin": 1,
	"Pad": 2, "Split": 2, // opset 1 named Pad's pads paddings and took Split's sizes as an input
	"Concat":  4,                       // axis was optional before opset 4
	"Reshape": 5,                       // the shape was an attribute before opset 5
	"Cast":    6, "Clip": 6, "Tile": 6, // Cast's to was a string, Tile took tiles and axis
}

// imports reports whether c converts opType at the given opset.
func (c converter) imports(opType string, opset int64) bool {
	if opset >= c.since {
		return true
	}
	from, ok := sameAsOpset7[opType]
	return ok && c.since <= 7 && opset >= from
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
}

func ret(v *value, err error) ([]*value, error) {
	if err != nil {
		return nil, err
	}
	return []*value{v}, nil
}

// foldLimit bounds the size of results computed on the host.
const foldLimit = 1 << 16

// need returns input i, which must be present.
func (n *node) need(i int) (*value, error) {
	v := n.input(i)
	if v == nil {
		return nil, fmt.Errorf("input %d is missing", i)
	}
	return v, nil
}

// knownInput returns the value of input i, which must be known at import
// time (a shape, axes, pads…); nil when the optional input is absent.
func (n *node) knownInput(i int, what string) (*Tensor, error) {
	v := n.input(i)
	if v == nil {
		return nil, nil
	}
	if !v.known() {
		return nil, &NeedsKnownError{Value: n.p.GetInput()[i], what: fmt.Sprintf("input %d (%s)", i, what)}
	}
	return v.c, nil
}

func init() {
	binaries := []struct {
		onnx, relax string
		f           func(x, y float64) float64
		fi          func(x, y int64) int64
		cmp         bool
	}{
		{"Add", "add", func(x, y float64) float64 { return x + y }, func(x, y int64) int64 { return x + y }, false},
		{"Sub", "subtract", func(x, y float64) float64 { return x - y }, func(x, y int64) int64 { return x - y }, false},
		{"Mul", "multiply", func(x, y float64) float64 { return x * y }, func(x, y int64) int64 { return x * y }, false},
		{"Div", "divide", func(x, y float64) float64 { return x / y }, func(x, y int64) int64 {
			if y == 0 {
				return 0
			}
			return x / y
		}, false},
		{"Pow", "power", math.Pow, nil, false},
		{"Equal", "equal", func(x, y float64) float64 { return b2f(x == y) }, nil, true},
		{"Less", "less", func(x, y float64) float64 { return b2f(x < y) }, nil, true},
		{"LessOrEqual", "less_equal", func(x, y float64) float64 { return b2f(x <= y) }, nil, true},
		{"Greater", "greater", func(x, y float64) float64 { return b2f(x > y) }, nil, true},
		{"GreaterOrEqual", "greater_equal", func(x, y float64) float64 { return b2f(x >= y) }, nil, true},
	}
	for _, b := range binaries {
		reg(b.onnx, 7, func(im *importer, n *node) ([]*value, error) {
			x, err := n.need(0)
			if err != nil {
				return nil, err
			}
			y, err := n.need(1)
			if err != nil {
				return nil, err
			}
			// Unsigned division truncates, which is flooring: one answer.
			if b.onnx == "Div" && x.dtype().Code == ndarray.Int && !(x.known() && y.known()) {
				return nil, unsupported("signed integer Div computed at run time")
			}
			if b.onnx == "Pow" && x.dtype() != y.dtype() {
				if y, err = im.cast(y, x.dtype()); err != nil {
					return nil, err
				}
			}
			if x.known() && y.known() {
				dt := x.dtype()
				if b.cmp {
					dt = ir.Bool
				}
				if t, err := hostBinary(x.c, y.c, dt, b.f, b.fi); err == nil && t.NumElements() <= foldLimit {
					return []*value{constant(t)}, nil
				}
			}
			return ret(im.emit("relax."+b.relax, nil, x, y))
		})
	}
	for onnxName, relax := range map[string]string{"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"} {
		reg(onnxName, 7, func(im *importer, n *node) ([]*value, error) {
			if len(n.in) == 0 {
				return nil, fmt.Errorf("no inputs")
			}
			acc, err := n.need(0)
			if err != nil {
				return nil, err
			}
			for i := 1; i < len(n.in); i++ {
				x, err := n.need(i)
				if err != nil {
					return nil, err
				}
				if acc, err = im.emit("relax."+relax, nil, acc, x); err != nil {
					return nil, err
				}
			}
			if onnxName == "Mean" && len(n.in) > 1 {
				return ret(im.emit("relax.divide", nil, acc, scalar(acc.dtype(), float64(len(n.in)))))
			}
			if len(n.in) == 1 {
				return ret(im.emit("relax.add", nil, acc, scalar(acc.dtype(), 0)))
			}
			return []*value{acc}, nil
		})
	}
	unary := map[string]string{
		"Relu": "nn.relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
		"Neg": "negative", "Abs": "abs", "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Round": "round",
		"Sin": "sin", "Cos": "cos", "Asin": "asin", "Acos": "acos", "Atan": "atan",
		"Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
	}
	for onnxName, relax := range unary {
		since := int64(7)
		switch onnxName {
		case "Asinh", "Acosh", "Atanh":
			since = 9 // the inverse hyperbolic functions came in opset 9
		}
		reg(onnxName, since, func(im *importer, n *node) ([]*value, error) {
			x, err := n.need(0)
			if err != nil {
				return nil, err
			}
			if relax == "negative" || relax == "abs" || relax == "nn.relu" {
				// integer inputs are fine
			} else if !x.dtype().IsFloat() {
				return nil, unsupported("%s of %s", n.p.GetOpType(), x.dtype())
			}
			if f, ok := hostUnary[onnxName]; ok && x.known() && x.c.NumElements() <= foldLimit {
				// Known at import (a shape computation): folded here.
				t := newTensor(x.dtype(), x.c.Shape)
				for i := range int(t.NumElements()) {
					if x.dtype().IsFloat() {
						setElem(t.Data, t.DType, i, f(x.c.elem(i)))
					} else {
						setIElem(t.Data, t.DType, i, int64(f(float64(x.c.ielem(i)))))
					}
				}
				return []*value{constant(t)}, nil
			}
			return ret(im.emit("relax."+relax, nil, x))
		})
	}
	reg("Reciprocal", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.divide", nil, scalar(x.dtype(), 1), x))
	})
	reg("Identity", 7, passThrough)
	reg("Dropout", 7, func(im *importer, n *node) ([]*value, error) {
		training := false
		if t, err := n.knownInput(2, "training_mode"); err != nil {
			return nil, err
		} else if t != nil && t.NumElements() == 1 && t.ielem(0) != 0 {
			training = true
		}
		if training {
			// Training with a ratio of 0 drops nothing; otherwise the mask
			// is random.
			r, err := n.knownInput(1, "ratio")
			if err != nil {
				return nil, err
			}
			if r == nil || r.NumElements() != 1 || r.elem(0) != 0 {
				return nil, unsupported("Dropout in training mode")
			}
		}
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		// Inference: the output is the input and the mask all true.
		return []*value{x, constant(hostExpand(scalarTensor(ir.Bool, 1), x.shape()))}, nil
	})
	reg("LeakyRelu", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		alpha := n.attrFloat("alpha", 0.01)
		ax, err := im.emit("relax.multiply", nil, x, scalar(x.dtype(), alpha))
		if err != nil {
			return nil, err
		}
		if alpha <= 1 {
			return ret(im.emit("relax.maximum", nil, x, ax))
		}
		return ret(im.emit("relax.minimum", nil, x, ax))
	})
	reg("HardSigmoid", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		return ret(im.hardSigmoid(x, n.attrFloat("alpha", 0.2), n.attrFloat("beta", 0.5)))
	})
	reg("HardSwish", 14, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		hs, err := im.hardSigmoid(x, 1.0/6, 0.5)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.multiply", nil, x, hs))
	})
	reg("Gelu", 20, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		switch n.attrString("approximate", "none") {
		case "none":
			return ret(im.emit("relax.nn.gelu", nil, x))
		case "tanh":
			return ret(im.emit("relax.nn.gelu_tanh", nil, x))
		}
		return nil, unsupported("approximate=%q", n.attrString("approximate", ""))
	})
	reg("Softplus", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		e, err := im.emit("relax.exp", nil, x)
		if err != nil {
			return nil, err
		}
		e1, err := im.emit("relax.add", nil, e, scalar(x.dtype(), 1))
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.log", nil, e1))
	})
	reg("Softsign", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		a, err := im.emit("relax.abs", nil, x)
		if err != nil {
			return nil, err
		}
		a1, err := im.emit("relax.add", nil, a, scalar(x.dtype(), 1))
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.divide", nil, x, a1))
	})
	elu := func(im *importer, x *value, alpha, gamma float64) (*value, error) {
		// gamma·(x > 0 ? x : alpha·(exp(x) − 1))
		e, err := im.emit("relax.exp", nil, x)
		if err != nil {
			return nil, err
		}
		e1, err := im.emit("relax.subtract", nil, e, scalar(x.dtype(), 1))
		if err != nil {
			return nil, err
		}
		ae, err := im.emit("relax.multiply", nil, e1, scalar(x.dtype(), alpha))
		if err != nil {
			return nil, err
		}
		pos, err := im.emit("relax.greater", nil, x, scalar(x.dtype(), 0))
		if err != nil {
			return nil, err
		}
		r, err := im.emit("relax.where", nil, pos, x, ae)
		if err != nil || gamma == 1 {
			return r, err
		}
		return im.emit("relax.multiply", nil, r, scalar(x.dtype(), gamma))
	}
	reg("Elu", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		return ret(elu(im, x, n.attrFloat("alpha", 1), 1))
	})
	reg("Selu", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		return ret(elu(im, x, n.attrFloat("alpha", 1.67326319217681884765625), n.attrFloat("gamma", 1.05070102214813232421875)))
	})
	reg("Celu", 12, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		// max(0, x) + min(0, alpha·(exp(x/alpha) − 1)): Elu of x/alpha
		// scaled by alpha.
		alpha := n.attrFloat("alpha", 1)
		xa, err := im.emit("relax.divide", nil, x, scalar(x.dtype(), alpha))
		if err != nil {
			return nil, err
		}
		e, err := elu(im, xa, 1, 1)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.multiply", nil, e, scalar(x.dtype(), alpha)))
	})
	reg("ThresholdedRelu", 10, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		gt, err := im.emit("relax.greater", nil, x, scalar(x.dtype(), n.attrFloat("alpha", 1)))
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.where", nil, gt, x, scalar(x.dtype(), 0)))
	})
	reg("PRelu", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		slope, err := n.need(1)
		if err != nil {
			return nil, err
		}
		pos, err := im.emit("relax.greater", nil, x, scalar(x.dtype(), 0))
		if err != nil {
			return nil, err
		}
		sx, err := im.emit("relax.multiply", nil, x, slope)
		if err != nil {
			return nil, err
		}
		return ret(im.emit("relax.where", nil, pos, x, sx))
	})
	reg("Clip", 7, convertClip)
	reg("Where", 9, func(im *importer, n *node) ([]*value, error) {
		c, err := n.need(0)
		if err != nil {
			return nil, err
		}
		x, err := n.need(1)
		if err != nil {
			return nil, err
		}
		y, err := n.need(2)
		if err != nil {
			return nil, err
		}
		if c.known() && x.known() && y.known() {
			shape, err := broadcastShape(c.shape(), x.shape())
			if err == nil {
				shape, err = broadcastShape(shape, y.shape())
			}
			if err == nil && numElements(shape) <= foldLimit {
				out := newTensor(x.dtype(), shape)
				es := x.dtype().Size()
				for i := int64(0); i < numElements(shape); i++ {
					src := y.c
					if c.c.ielem(int(bindex(i, shape, c.shape()))) != 0 {
						src = x.c
					}
					j := bindex(i, shape, src.Shape)
					copy(out.Data[int(i)*es:int(i+1)*es], src.Data[int(j)*es:int(j+1)*es])
				}
				return []*value{constant(out)}, nil
			}
		}
		return ret(im.emit("relax.where", nil, c, x, y))
	})
	reg("Cast", 7, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		dt, err := dtypeOf(int32(n.attrInt("to", 0)))
		if err != nil {
			return nil, unsupported("Cast to: %v", err)
		}
		return ret(im.cast(x, dt))
	})
	reg("CastLike", 15, func(im *importer, n *node) ([]*value, error) {
		x, err := n.need(0)
		if err != nil {
			return nil, err
		}
		like, err := n.need(1)
		if err != nil {
			return nil, err
		}
		return ret(im.cast(x, like.dtype()))
	})
	registerShapeOps()
	registerNNOps()
}

// hostUnary computes the unary operators folded when their input is
// known.
var hostUnary = map[string]func(float64) float64{
	"Neg": func(x float64) float64 { return -x }, "Abs": math.Abs, "Floor": math.Floor, "Ceil": math.Ceil,
	"Relu": func(x float64) float64 { return math.Max(x, 0) }, "Sin": math.Sin, "Cos": math.Cos, "Exp": math.Exp,
	"Log": math.Log, "Sqrt": math.Sqrt, "Tanh": math.Tanh, "Erf": math.Erf, "Round": math.RoundToEven,
	"Sigmoid": func(x float64) float64 { return 1 / (1 + math.Exp(-x)) },
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func passThrough(im *importer, n *node) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	return []*value{x}, nil
}

// cast converts x to dt (folded when x is known).
func (im *importer) cast(x *value, dt ir.DType) (*value, error) {
	if x.dtype() == dt {
		return x, nil
	}
	if x.known() {
		return constant(x.c.cast(dt)), nil
	}
	if x.dtype() == ndarray.BFloat16 || dt == ndarray.BFloat16 {
		return nil, unsupported("Cast of %s to %s computed at run time (kiln's code generators have no bfloat16 type)", x.dtype(), dt)
	}
	if x.dtype().IsFloat() && dt == ir.Bool {
		return im.emit("relax.not_equal", nil, x, scalar(x.dtype(), 0))
	}
	return im.emit("relax.astype", map[string]any{"dtype": dt.String()}, x)
}

// hardSigmoid is max(0, min(1, alpha·x + beta)).
func (im *importer) hardSigmoid(x *value, alpha, beta float64) (*value, error) {
	ax, err := im.emit("relax.multiply", nil, x, scalar(x.dtype(), alpha))
	if err != nil {
		return nil, err
	}
	axb, err := im.emit("relax.add", nil, ax, scalar(x.dtype(), beta))
	if err != nil {
		return nil, err
	}
	return im.clip(axb, 0, 1, true, true)
}

// clip bounds x to [lo, hi]; a bound whose has flag is false is left open.
func (im *importer) clip(x *value, lo, hi float64, hasLo, hasHi bool) (*value, error) {
	dt := x.dtype()
	if hasLo && hasHi && dt.IsFloat() && finite(lo) && finite(hi) {
		return im.emit("relax.clip", nil, x, &ir.PrimValue{Value: ir.NewFloatImm(dt, lo)}, &ir.PrimValue{Value: ir.NewFloatImm(dt, hi)})
	}
	var err error
	if hasLo {
		if x, err = im.emit("relax.maximum", nil, x, scalar(dt, lo)); err != nil {
			return nil, err
		}
	}
	if hasHi {
		if x, err = im.emit("relax.minimum", nil, x, scalar(dt, hi)); err != nil {
			return nil, err
		}
	}
	return x, nil
}

func convertClip(im *importer, n *node) ([]*value, error) {
	x, err := n.need(0)
	if err != nil {
		return nil, err
	}
	var lo, hi float64
	var hasLo, hasHi bool
	if n.opset < 11 {
		lo, hi = n.attrFloat("min", -math.MaxFloat32), n.attrFloat("max", math.MaxFloat32)
		_, hasLo = n.attrs["min"]
		_, hasHi = n.attrs["max"]
	} else {
		for i, dst := range []*float64{&lo, &hi} {
			if b := n.input(i + 1); b != nil && !b.known() {
				// A bound computed at run time.
				opName := []string{"relax.maximum", "relax.minimum"}[i]
				if x, err = im.emit(opName, nil, x, b); err != nil {
					return nil, err
				}
				continue
			}
			t, err := n.knownInput(i+1, []string{"min", "max"}[i])
			if err != nil {
				return nil, err
			}
			if t != nil {
				if t.NumElements() != 1 {
					return nil, fmt.Errorf("%s has %d elements, want a scalar", []string{"min", "max"}[i], t.NumElements())
				}
				*dst = t.elem(0)
				if i == 0 {
					hasLo = true
				} else {
					hasHi = true
				}
			}
		}
	}
	if !hasLo && !hasHi {
		return ret(im.emit("relax.add", nil, x, scalar(x.dtype(), 0)))
	}
	return ret(im.clip(x, lo, hi, hasLo, hasHi))
}
