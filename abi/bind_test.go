package abi_test

import (
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/internal/check"
)

func vaddInfo() abi.FuncInfo {
	n := abi.Dim{Name: "n"}
	return abi.FuncInfo{Name: "vadd", Params: []abi.ParamInfo{
		{Name: "A", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{n}},
		{Name: "B", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{n}},
		{Name: "C", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{n, {Value: 4}}},
		{Name: "k", Kind: abi.ParamInt},
	}}
}

func TestBind(t *testing.T) {
	got, err := vaddInfo().Bind(map[string][]int64{"A": {7}, "B": {7}}, nil)
	check.NoError(t, err)
	check.Equal(t, got, map[string][]int64{"A": {7}, "B": {7}, "C": {7, 4}})

	got, err = vaddInfo().Bind(nil, map[string]int64{"k": 3})
	check.Error(t, err, `parameter "A": dimension 0 is n, which no input determines`)
	_ = got

	for _, tc := range []struct {
		name    string
		tensors map[string][]int64
		ints    map[string]int64
		want    string
	}{
		{"unknown", map[string][]int64{"X": {1}}, nil, `no parameter "X" (parameters: A, B, C, k)`},
		{"scalar as tensor", map[string][]int64{"k": {1}}, nil, `parameter "k" is a int, not a tensor`},
		{"rank", map[string][]int64{"A": {1, 2}}, nil, `parameter "A": 2 dimensions (1, 2), want 1 (n,)`},
		{"static", map[string][]int64{"A": {3}, "C": {3, 5}}, nil, `parameter "C": shape (3, 5), want (n, 4)`},
		{"disagree", map[string][]int64{"A": {3}, "B": {4}}, nil, `parameter "B": dimension 0 is 4, but n is 3 from parameter A`},
		{"int not tensor", nil, map[string]int64{"A": 1}, `parameter "A" is a tensor, not an int`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := vaddInfo().Bind(tc.tensors, tc.ints)
			check.Error(t, err, tc.want)
		})
	}
}
