package onnx

import (
	"fmt"
	"math"
)

// The window functions of opset 17 (HannWindow, HammingWindow,
// BlackmanWindow): their length is the output's shape, so it must be
// known at import time, and the window is computed then.

func init() {
	windows := map[string][]float64{ // cosine coefficients a0 − a1·cos(2πn/N) + a2·cos(4πn/N)
		"HannWindow":     {0.5, 0.5, 0},
		"HammingWindow":  {25.0 / 46, 1 - 25.0/46, 0},
		"BlackmanWindow": {0.42, 0.5, 0.08},
	}
	for name, a := range windows {
		reg(name, 17, func(im *importer, n *node) ([]*value, error) {
			t, err := n.knownInput(0, "size (the window's length is the output's shape)")
			if err != nil {
				return nil, err
			}
			if t == nil || t.NumElements() != 1 || t.ielem(0) < 0 {
				return nil, fmt.Errorf("input 0 (size) must be one value, not negative")
			}
			dt, err := dtypeOf(int32(n.attrInt("output_datatype", 1)))
			if err != nil {
				return nil, unsupported("output_datatype: %v", err)
			}
			size := t.ielem(0)
			den := float64(size)
			if n.attrInt("periodic", 1) == 0 {
				den--
			}
			out := newTensor(dt, []int64{size})
			for i := range size {
				x := 2 * math.Pi * float64(i) / den
				v := a[0] - a[1]*math.Cos(x) + a[2]*math.Cos(2*x)
				if dt.IsFloat() {
					setElem(out.Data, dt, int(i), v)
				} else {
					setIElem(out.Data, dt, int(i), int64(v))
				}
			}
			return []*value{constant(out)}, nil
		})
	}
}
