package onnx

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// The recurrent layers RNN, GRU and LSTM, unrolled over the sequence at
// import: the input projection of every step is one matmul, then each
// step is a matmul of the hidden state with the recurrence weights and
// the gate arithmetic. sequence_lens (forward direction) holds a batch
// entry's state and zeroes its outputs past its length.

func init() {
	reg("RNN", 7, func(im *importer, n *node) ([]*value, error) { return convertRNN(im, n, rnnCell, 1) })
	reg("GRU", 7, func(im *importer, n *node) ([]*value, error) { return convertRNN(im, n, gruCell, 3) })
	reg("LSTM", 7, func(im *importer, n *node) ([]*value, error) { return convertRNN(im, n, lstmCell, 4) })
}

// rnnStep is what one cell needs at a step.
type rnnStep struct {
	g      *gb
	xw     *value // the input projection plus both biases, [B, G·H]
	h, c   *value // the state, [B, H]
	r      *value // the recurrence weights transposed, [H, G·H]
	rb     *value // the recurrence bias alone, [G·H] (GRU's linear_before_reset)
	p      *value // LSTM peepholes [3·H]
	hidden int64
	act    []func(*value) *value
	clip   float64
	n      *node
}

// gate is gate k of the G gates in a [B, G·H] (or [G·H]) value.
func (s *rnnStep) gate(v *value, k int64) *value {
	if v == nil {
		return s.g.fail(fmt.Errorf("a gate of a missing value"))
	}
	return s.g.slice1(v, v.rank()-1, k*s.hidden, (k+1)*s.hidden)
}

// clipped bounds a gate's input to [−clip, clip] when clip is set.
func (s *rnnStep) clipped(v *value) *value {
	if s.clip <= 0 || s.g.err != nil {
		return v
	}
	return s.g.keep(s.g.im.clip(v, -s.clip, s.clip, true, true))
}

type cellFn func(s *rnnStep) (h, c *value)

func rnnCell(s *rnnStep) (*value, *value) {
	g := s.g
	return s.act[0](s.clipped(g.op("add", nil, s.xw, g.op("matmul", nil, s.h, s.r)))), nil
}

func gruCell(s *rnnStep) (*value, *value) {
	g := s.g
	hr := g.op("matmul", nil, s.h, s.r) // [B, 3H], recurrence bias not in it
	z := s.act[0](s.clipped(g.op("add", nil, g.op("add", nil, s.gate(s.xw, 0), s.gate(hr, 0)), s.gate(s.rb, 0))))
	r := s.act[0](s.clipped(g.op("add", nil, g.op("add", nil, s.gate(s.xw, 1), s.gate(hr, 1)), s.gate(s.rb, 1))))
	rh := s.gate(s.r, 2) // [H, H]
	var pre *value
	if s.n.attrInt("linear_before_reset", 0) != 0 {
		pre = g.op("add", nil, s.gate(s.xw, 2), g.op("multiply", nil, r, g.op("add", nil, s.gate(hr, 2), s.gate(s.rb, 2))))
	} else {
		pre = g.op("add", nil, g.op("add", nil, s.gate(s.xw, 2), g.op("matmul", nil, g.op("multiply", nil, r, s.h), rh)), s.gate(s.rb, 2))
	}
	ht := s.act[1](s.clipped(pre))
	// (1 − z)·ht + z·H = ht + z·(H − ht)
	return g.op("add", nil, ht, g.op("multiply", nil, z, g.op("subtract", nil, s.h, ht))), nil
}

func lstmCell(s *rnnStep) (*value, *value) {
	g := s.g
	pre := g.op("add", nil, s.xw, g.op("matmul", nil, s.h, s.r))
	peep := func(k int64, c *value, v *value) *value {
		if s.p == nil {
			return v
		}
		return g.op("add", nil, v, g.op("multiply", nil, g.slice1(s.p, 0, k*s.hidden, (k+1)*s.hidden), c))
	}
	i := s.act[0](s.clipped(peep(0, s.c, s.gate(pre, 0))))
	f := s.act[0](s.clipped(peep(2, s.c, s.gate(pre, 2))))
	if s.n.attrInt("input_forget", 0) != 0 {
		f = g.op("subtract", nil, scalar(s.h.dtype(), 1), i)
	}
	ct := s.act[1](s.clipped(s.gate(pre, 3)))
	c := g.op("add", nil, g.op("multiply", nil, f, s.c), g.op("multiply", nil, i, ct))
	o := s.act[0](s.clipped(peep(1, c, s.gate(pre, 1))))
	return g.op("multiply", nil, o, s.act[2](c)), c
}

// rnnActivations reads the activations attribute (per direction, with
// their alphas and betas), or the defaults.
func rnnActivations(g *gb, n *node, per, dirs int) ([][]func(*value) *value, error) {
	names := []string{"Tanh"}
	switch per {
	case 2:
		names = []string{"Sigmoid", "Tanh"}
	case 3:
		names = []string{"Sigmoid", "Tanh", "Tanh"}
	}
	var given []string
	if a, ok := n.attrs["activations"]; ok {
		for _, s := range a.GetStrings() {
			given = append(given, string(s))
		}
	}
	alphas, betas := n.attrs["activation_alpha"].GetFloats(), n.attrs["activation_beta"].GetFloats()
	out := make([][]func(*value) *value, dirs)
	k := 0
	for d := range dirs {
		for j := range per {
			name := names[j]
			if len(given) > 0 {
				if d*per+j >= len(given) {
					return nil, fmt.Errorf("activations %v: want %d", given, per*dirs)
				}
				name = given[d*per+j]
			}
			ab := func(def float64, vs []float32) float64 {
				if k < len(vs) {
					return float64(vs[k])
				}
				return def
			}
			var f func(*value) *value
			switch strings.ToLower(name) {
			case "sigmoid":
				f = func(v *value) *value { return g.op("sigmoid", nil, v) }
			case "tanh":
				f = func(v *value) *value { return g.op("tanh", nil, v) }
			case "relu":
				f = func(v *value) *value { return g.op("nn.relu", nil, v) }
			case "hardsigmoid":
				a, b := ab(0.2, alphas), ab(0.5, betas)
				f = func(v *value) *value { return g.do(func() (*value, error) { return g.im.hardSigmoid(v, a, b) }) }
			case "affine":
				a, b := ab(1, alphas), ab(0, betas)
				f = func(v *value) *value {
					return g.op("add", nil, g.op("multiply", nil, v, scalar(v.dtype(), a)), scalar(v.dtype(), b))
				}
			case "scaledtanh":
				a, b := ab(1, alphas), ab(1, betas)
				f = func(v *value) *value {
					return g.op("multiply", nil, g.op("tanh", nil, g.op("multiply", nil, v, scalar(v.dtype(), b))), scalar(v.dtype(), a))
				}
			default:
				return nil, unsupported("recurrent activation %q", name)
			}
			if strings.EqualFold(name, "hardsigmoid") || strings.EqualFold(name, "affine") || strings.EqualFold(name, "scaledtanh") {
				k++
			}
			out[d] = append(out[d], f)
		}
	}
	return out, nil
}

func convertRNN(im *importer, n *node, cell cellFn, gates int64) ([]*value, error) {
	in, err := n.inputs(3)
	if err != nil {
		return nil, err
	}
	x, w, r := in[0], in[1], in[2]
	if !x.dtype().IsFloat() || x.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
		return nil, fmt.Errorf("want float X, W and R of rank 3, got %s%v, %v, %v", x.dtype(), x.shape(), w.shape(), r.shape())
	}
	dirs := 1
	dirName := n.attrString("direction", "forward")
	switch dirName {
	case "forward", "reverse":
	case "bidirectional":
		dirs = 2
	default:
		return nil, fmt.Errorf("direction %q is not forward, reverse or bidirectional", dirName)
	}
	hidden := n.attrInt("hidden_size", r.shape()[2])
	layout := n.attrInt("layout", 0)
	g := im.builder()
	if layout != 0 {
		x = g.permute(x, []int{1, 0, 2})
	}
	if g.err != nil {
		return nil, g.err
	}
	seq, batch := x.shape()[0], x.shape()[1]
	if w.shape()[0] != int64(dirs) || w.shape()[1] != gates*hidden || r.shape()[1] != gates*hidden || r.shape()[2] != hidden {
		return nil, fmt.Errorf("W %v and R %v do not fit %d directions of %d gates of hidden size %d", w.shape(), r.shape(), dirs, gates, hidden)
	}
	per := map[int64]int{1: 1, 3: 2, 4: 3}[gates]
	acts, err := rnnActivations(g, n, per, dirs)
	if err != nil {
		return nil, err
	}
	// sequence_lens: a [S, B, 1] mask of the steps each batch entry takes.
	var mask *value
	if sl := n.input(4); sl != nil {
		steps := g.op("less", nil, iotaAlong(ir.Int64, seq, 0, 3), g.reshape(g.cast(sl, ir.Int64), []int64{1, batch, 1}))
		if sl.known() && allAtLeast(sl.c, seq) {
			steps = nil
		} else if dirName != "forward" {
			return nil, unsupported("%s with sequence_lens in direction %q", n.p.GetOpType(), dirName)
		}
		mask = steps
	}
	dt := x.dtype()
	var ys, hs, cs []*value
	for d := range dirs {
		dd := int64(d)
		wd := g.permute(g.reshape(g.slice1(w, 0, dd, dd+1), []int64{gates * hidden, x.shape()[2]}), []int{1, 0})
		s := &rnnStep{g: g, hidden: hidden, act: acts[d], clip: n.attrFloat("clip", 0), n: n}
		s.r = g.permute(g.reshape(g.slice1(r, 0, dd, dd+1), []int64{gates * hidden, hidden}), []int{1, 0})
		xw := g.op("matmul", nil, x, wd) // [S, B, G·H]
		s.rb = constant(newTensor(dt, []int64{gates * hidden}))
		if b := n.input(3); b != nil {
			bd := g.reshape(g.slice1(b, 0, dd, dd+1), []int64{2 * gates * hidden})
			wb, rb := g.slice1(bd, 0, 0, gates*hidden), g.slice1(bd, 0, gates*hidden, 2*gates*hidden)
			if gates == 3 {
				// GRU: the recurrence bias of the candidate gate goes
				// where linear_before_reset puts it, so the cell adds it.
				xw, s.rb = g.op("add", nil, xw, wb), rb
			} else {
				xw = g.op("add", nil, xw, g.op("add", nil, wb, rb))
			}
		}
		state := func(i int) *value {
			if v := n.input(i); v != nil {
				return g.reshape(g.slice1(v, 0, dd, dd+1), []int64{batch, hidden})
			}
			return constant(newTensor(dt, []int64{batch, hidden}))
		}
		s.h = state(5)
		if gates == 4 {
			s.c = state(6)
			if p := n.input(7); p != nil {
				s.p = g.reshape(g.slice1(p, 0, dd, dd+1), []int64{3 * hidden})
			}
		}
		reverse := dirName == "reverse" || d == 1
		out := make([]*value, seq)
		for step := range seq {
			t := step
			if reverse {
				t = seq - 1 - step
			}
			s.xw = g.reshape(g.slice1(xw, 0, t, t+1), []int64{batch, gates * hidden})
			h, c := cell(s)
			if mask != nil {
				m := g.reshape(g.slice1(mask, 0, t, t+1), []int64{batch, 1})
				out[t] = g.op("where", nil, m, h, scalar(dt, 0))
				h = g.op("where", nil, m, h, s.h)
				if c != nil {
					c = g.op("where", nil, m, c, s.c)
				}
			} else {
				out[t] = h
			}
			s.h, s.c = h, c
			if g.err != nil {
				return nil, g.err
			}
		}
		for t := range out {
			out[t] = g.reshape(out[t], []int64{1, 1, batch, hidden})
		}
		ys = append(ys, g.concat(out, 0))
		hs = append(hs, g.reshape(s.h, []int64{1, batch, hidden}))
		if s.c != nil {
			cs = append(cs, g.reshape(s.c, []int64{1, batch, hidden}))
		}
	}
	join := func(vs []*value, axis int) *value {
		if len(vs) == 1 {
			return vs[0]
		}
		return g.concat(vs, axis)
	}
	y, yh := join(ys, 1), join(hs, 0)
	if layout != 0 {
		y, yh = g.permute(y, []int{2, 0, 1, 3}), g.permute(yh, []int{1, 0, 2})
	}
	outs := []*value{y, yh}
	if gates == 4 {
		yc := join(cs, 0)
		if layout != 0 {
			yc = g.permute(yc, []int{1, 0, 2})
		}
		outs = append(outs, yc)
	}
	return g.result(outs...)
}

// allAtLeast reports whether every value of t is at least n.
func allAtLeast(t *Tensor, n int64) bool {
	for i := range int(t.NumElements()) {
		if t.ielem(i) < n {
			return false
		}
	}
	return true
}
