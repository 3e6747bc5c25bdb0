package main

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// weightedModule is a graph module whose artifact bundles weights
// (params.safetensors, as an ONNX model's build does): its functions may be
// called with the inputs alone, the weights filled in by name, as kiln run
// does.
type weightedModule struct {
	packedfunc.Module
	exe     *vm.Executable
	weights map[string]*ndarray.NDArray
}

// withWeights wraps m when the artifact bundles weights.
func withWeights(m packedfunc.Module, exe *vm.Executable, a *artifact.Artifact) (packedfunc.Module, error) {
	w, err := bundledWeights(a)
	if err != nil || w == nil {
		return m, err
	}
	return &weightedModule{Module: m, exe: exe, weights: w}, nil
}

// bundledWeights reads the artifact's weights by parameter name (dotted
// module paths, "fc1.weight", also as fc1_weight); nil when it has none.
func bundledWeights(a *artifact.Artifact) (map[string]*ndarray.NDArray, error) {
	b, ok := a.Files[artifact.Params]
	if !ok {
		return nil, nil
	}
	ps, _, err := ndarray.ReadSafetensors(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("bundled %s: %w", artifact.Params, err)
	}
	w := map[string]*ndarray.NDArray{}
	for k, v := range ps {
		w[k] = v
		w[strings.ReplaceAll(k, ".", "_")] = v
	}
	return w, nil
}

func (m *weightedModule) GetFunction(name string) (*packedfunc.Func, error) {
	f, err := m.Module.GetFunction(name)
	if err != nil {
		return nil, err
	}
	info, ok := m.exe.Function(name)
	if !ok {
		return f, nil
	}
	var inputs []string
	for _, p := range info.Params {
		if m.weights[p.Name] == nil {
			inputs = append(inputs, p.Name)
		}
	}
	if len(inputs) == len(info.Params) {
		return f, nil
	}
	params := info.Params
	return packedfunc.New(name, func(args []packedfunc.Value) (packedfunc.Value, error) {
		if len(args) == len(params) {
			return f.Call(args...)
		}
		if len(args) != len(inputs) {
			return packedfunc.Nil, fmt.Errorf("%s: %w: want the inputs %s (the weights are bundled), got %d arguments",
				name, packedfunc.ErrArity, strings.Join(inputs, ", "), len(args))
		}
		full := make([]packedfunc.Value, 0, len(params))
		i := 0
		for _, p := range params {
			if w := m.weights[p.Name]; w != nil {
				full = append(full, packedfunc.Array(w))
				continue
			}
			full = append(full, args[i])
			i++
		}
		return f.Call(full...)
	}), nil
}
