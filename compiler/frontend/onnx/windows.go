package onnx

import (
	"fmt"
	"math"
)

// The window functions of opset 17 (HannWindow, HammingWindow,
// BlackmanWindow) and MelWeightMatrix: their sizes are the output's
// shape, so they must be known at import time, and the matrices are
// computed then.

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
	reg("MelWeightMatrix", 17, convertMelWeightMatrix)
}

// convertMelWeightMatrix is the [dft_length/2+1, num_mel_bins] matrix of
// triangular filters spaced evenly on the mel scale between the edge
// frequencies, as ONNX's reference computes it.
func convertMelWeightMatrix(im *importer, n *node) ([]*value, error) {
	var args [5]float64
	for i, what := range []string{"num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"} {
		t, err := n.knownInput(i, what+" (it decides the output)")
		if err != nil {
			return nil, err
		}
		if t == nil || t.NumElements() != 1 {
			return nil, fmt.Errorf("input %d (%s) must be one value", i, what)
		}
		args[i] = t.elem(0)
	}
	bins, dft, rate, lo, hi := int64(args[0]), int64(args[1]), args[2], args[3], args[4]
	if bins <= 0 || dft <= 0 || rate <= 0 {
		return nil, fmt.Errorf("num_mel_bins %d, dft_length %d and sample_rate %g must be positive", bins, dft, rate)
	}
	dt, err := dtypeOf(int32(n.attrInt("output_datatype", 1)))
	if err != nil {
		return nil, unsupported("output_datatype: %v", err)
	}
	spec := dft/2 + 1
	mel := func(f float64) float64 { return 2595 * math.Log10(1+f/700) }
	loMel, hiMel := mel(lo), mel(hi)
	step := (hiMel - loMel) / float64(bins+2)
	edge := make([]int64, bins+2)
	for i := range edge {
		hz := 700 * (math.Pow(10, (float64(i)*step+loMel)/2595) - 1)
		edge[i] = int64(math.Floor(float64(dft+1) * hz / rate))
	}
	out := newTensor(dt, []int64{spec, bins})
	set := func(j, i int64, v float64) error {
		if j < 0 || j >= spec {
			return fmt.Errorf("mel filter %d reaches bin %d of %d (are the edge frequencies within sample_rate/2?)", i, j, spec)
		}
		setElem(out.Data, dt, int(j*bins+i), v)
		return nil
	}
	for i := range bins {
		l, c, h := edge[i], edge[i+1], edge[i+2]
		if c == l {
			if err := set(c, i, 1); err != nil {
				return nil, err
			}
		} else {
			for j := l; j <= c; j++ {
				if err := set(j, i, float64(j-l)/float64(c-l)); err != nil {
					return nil, err
				}
			}
		}
		for j := c; j < h; j++ {
			if err := set(j, i, float64(h-j)/float64(h-c)); err != nil {
				return nil, err
			}
		}
	}
	return []*value{constant(out)}, nil
}
