package cli

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// prepareVMCall prepares a call of a graph function of a VM artifact:
// every parameter comes from --input or from the --params file.
func prepareVMCall(a *artifact.Artifact, name string, inputs []string, paramsFile string) (abi.FuncInfo, *preparedCall, error) {
	exe, err := vm.Unmarshal(a.Files[artifact.VMExec])
	if err != nil {
		return abi.FuncInfo{}, nil, err
	}
	if name == "" {
		name = "main"
	}
	f, ok := exe.Function(name)
	if !ok {
		return abi.FuncInfo{}, nil, fmt.Errorf("no graph function %q (the artifact has %s)", name, strings.Join(exe.FunctionNames(), ", "))
	}
	given := map[string]*ndarray.NDArray{}
	// Weights: bundled in the artifact, then --params (which wins). Keys
	// may be dotted module paths ("fc1.weight") for parameter fc1_weight.
	addParams := func(ps map[string]*ndarray.NDArray) {
		for k, v := range ps {
			given[k] = v
			given[strings.ReplaceAll(k, ".", "_")] = v
		}
	}
	if b, ok := a.Files[artifact.Params]; ok {
		ps, _, err := ndarray.ReadSafetensors(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return abi.FuncInfo{}, nil, fmt.Errorf("bundled %s: %w", artifact.Params, err)
		}
		addParams(ps)
	}
	if paramsFile != "" {
		ps, _, err := ndarray.LoadSafetensors(paramsFile)
		if err != nil {
			return abi.FuncInfo{}, nil, fmt.Errorf("--params: %w", err)
		}
		addParams(ps)
	}
	weights := map[string]bool{}
	for k := range given {
		weights[k] = true
	}
	var inputNames []string
	for _, in := range inputs {
		n, file, ok := strings.Cut(in, "=")
		if !ok || n == "" || file == "" {
			return abi.FuncInfo{}, nil, fmt.Errorf("--input %q: want NAME=FILE.npy", in)
		}
		arr, err := ndarray.LoadNPY(file)
		if err != nil {
			return abi.FuncInfo{}, nil, fmt.Errorf("input %s: %w", n, err)
		}
		given[n] = arr
		inputNames = append(inputNames, n)
	}
	// A name the function has no input of is named first: a model's
	// inputs are its parameters that no weights supply.
	var names, free []string
	for _, p := range f.Params {
		names = append(names, p.Name)
		if !weights[p.Name] {
			free = append(free, strconv.Quote(p.Name))
		}
	}
	for _, k := range inputNames {
		if !slices.Contains(names, k) {
			have := "none: the weights supply every parameter"
			if len(free) > 0 {
				have = strings.Join(free, ", ")
			}
			return abi.FuncInfo{}, nil, fmt.Errorf("--input %s: %s has no input %q (its inputs: %s)", k, name, k, have)
		}
	}
	fi := abi.FuncInfo{Name: name}
	call := &preparedCall{vm: true, arrays: map[string]*ndarray.NDArray{}}
	for _, p := range f.Params {
		arr, ok := given[p.Name]
		if !ok {
			return abi.FuncInfo{}, nil, fmt.Errorf("%s: parameter %q not given: pass --input %s=FILE.npy or a --params file that has it", name, p.Name, p.Name)
		}
		pi := abi.ParamInfo{Name: p.Name, Kind: abi.ParamTensor}
		if p.DType != (ndarray.DType{}) {
			pi.DType = p.DType.String()
		}
		fi.Params = append(fi.Params, pi)
		call.arrays[p.Name] = arr
		call.args = append(call.args, packedfunc.Array(arr))
	}
	call.fn = fi
	return fi, call, nil
}
