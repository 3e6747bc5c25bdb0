// Package conformance runs ONNX's backend test suite (the node tests:
// a directory per test holding model.onnx and test_data_set_*/ with
// input_N.pb and output_N.pb) through kiln: each model is imported,
// built for the CPU and run on every data set, and its outputs compared
// with ONNX's tolerances (rtol 1e-3, atol 1e-7).
//
// Models are built in batches, many graph functions to one module, so
// the suite costs a few compiler invocations (and nothing once the build
// cache holds them); a batch that fails to build is split in halves until
// the failing models are found. A test whose operator kiln does not
// import is counted as unsupported, a wrong number or any other error as
// failed; nothing panics out of Run.
//
// The package imports the compiler, the VM and the CPU backend; it is
// used by the conformance test and by the onnx-conformance benchmark.
package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// Outcome of one test.
const (
	Passed      = "passed"
	Failed      = "failed"
	Unsupported = "unsupported"
)

// Result is the outcome of one backend test.
type Result struct {
	Name string `json:"name"`
	// Op is the op type the test is about (the last node's, which for
	// the expanded function tests is the operator's last step).
	Op     string `json:"op"`
	Status string `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Count is the tally of one operator (or of the whole suite).
type Count struct {
	Passed      int `json:"passed"`
	Failed      int `json:"failed"`
	Unsupported int `json:"unsupported"`
}

func (c *Count) add(status string) {
	switch status {
	case Passed:
		c.Passed++
	case Failed:
		c.Failed++
	default:
		c.Unsupported++
	}
}

// Report is the outcome of a run.
type Report struct {
	Count
	Total   int              `json:"total"`
	ByOp    map[string]Count `json:"by_op"`
	Results []Result         `json:"results"`
}

// Options says how to run.
type Options struct {
	// Batch is about how many models go to one build (default 64): the
	// suite is cut into total/Batch batches.
	Batch int
	// NoCache skips the build cache.
	NoCache bool
	// Filter, when set, keeps only the tests whose name contains it.
	Filter string
	// Progress, when set, is called after every batch.
	Progress func(done, total int)
}

// testCase is one imported test.
type testCase struct {
	res    *Result
	dir    string
	fn     string // graph function name in the batch
	mod    *ir.IRModule
	order  []string // weight parameter names
	ps     map[string]*ndarray.NDArray
	known  map[string]*onnx.Tensor // inputs fixed at import
	inputs []string                // the model's input names
}

// knownInput returns the value of the model input name in the test's
// data sets, or nil when it is not an input or the data sets disagree.
func knownInput(dir string, m *onnx.Model, name string) *onnx.Tensor {
	at := -1
	for i, in := range m.Inputs {
		if in.GetName() == name {
			at = i
		}
	}
	if at < 0 {
		return nil
	}
	sets, _ := filepath.Glob(filepath.Join(dir, "test_data_set_*"))
	var known *onnx.Tensor
	for _, set := range sets {
		ins, err := readTensors(set, "input")
		if err != nil || len(ins) != len(m.Inputs) {
			return nil
		}
		if known != nil && !bytes.Equal(known.Data, ins[at].Data) {
			return nil
		}
		known = ins[at]
	}
	return known
}

// sources returns the model inputs that value is computed from (value
// itself when it is one).
func sources(m *onnx.Model, value string) []string {
	isInput := map[string]bool{}
	for _, in := range m.Inputs {
		isInput[in.GetName()] = true
	}
	producer := map[string]int{}
	for i, n := range m.Nodes {
		for _, o := range n.GetOutput() {
			producer[o] = i
		}
	}
	var out []string
	seen := map[string]bool{}
	stack := []string{value}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[v] {
			continue
		}
		seen[v] = true
		if isInput[v] {
			out = append(out, v)
		}
		if i, ok := producer[v]; ok {
			stack = append(stack, m.Nodes[i].GetInput()...)
		}
	}
	sort.Strings(out)
	return out
}

// Run runs every test under dir (ONNX's backend-test "node" directory,
// or any directory of test directories).
func Run(ctx context.Context, dir string, opts Options) (*Report, error) {
	if opts.Batch <= 0 {
		opts.Batch = 64
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	rep := &Report{ByOp: map[string]Count{}}
	var all, cases []*testCase
	for _, e := range ents {
		if !e.IsDir() || opts.Filter != "" && !strings.Contains(e.Name(), opts.Filter) {
			continue
		}
		tc := &testCase{res: &Result{Name: e.Name()}, dir: filepath.Join(dir, e.Name()), fn: "t_" + onnx.VarName(e.Name())}
		prepare(tc)
		all = append(all, tc)
		if tc.res.Status == "" {
			cases = append(cases, tc)
		}
	}
	// A test's batch is chosen by a hash of its name, so that a test
	// newly imported (or one that changes) rebuilds only its own batch
	// and the others come from the build cache.
	nb := max(1, (len(all)+opts.Batch-1)/opts.Batch)
	batches := make([][]*testCase, nb)
	for _, tc := range cases {
		h := fnv.New32a()
		h.Write([]byte(tc.res.Name))
		b := int(h.Sum32() % uint32(nb))
		batches[b] = append(batches[b], tc)
	}
	done := 0
	for _, b := range batches {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		runBatch(ctx, b, opts)
		done += len(b)
		if opts.Progress != nil {
			opts.Progress(done, len(cases))
		}
	}
	for _, tc := range all {
		rep.Results = append(rep.Results, *tc.res)
		c := rep.ByOp[tc.res.Op]
		c.add(tc.res.Status)
		rep.ByOp[tc.res.Op] = c
		rep.Count.add(tc.res.Status)
		rep.Total++
	}
	return rep, nil
}

// prepare reads and imports one test; a failure sets its status.
func prepare(tc *testCase) {
	defer func() {
		if r := recover(); r != nil {
			tc.res.Status, tc.res.Detail = Failed, fmt.Sprintf("panic while importing: %v\n%s", r, debug.Stack())
		}
	}()
	m, err := onnx.ReadFile(filepath.Join(tc.dir, "model.onnx"))
	if err != nil {
		tc.res.Op = "?"
		classify(tc.res, err)
		return
	}
	if len(m.Nodes) > 0 {
		tc.res.Op = m.Nodes[len(m.Nodes)-1].GetOpType()
	}
	mod, ps, err := onnx.Import(m, onnx.Options{Func: tc.fn, ConstLimit: 1 << 12})
	// Shapes, axes or scales that come from a model input: specialize the
	// model to the value the test data gives it, when every data set
	// agrees on it.
	for range 8 {
		var nk *onnx.NeedsKnownError
		if !errors.As(err, &nk) {
			break
		}
		// The value is an input, or computed from inputs: fix those the
		// data sets agree on.
		fixed := 0
		for _, name := range sources(m, nk.Value) {
			t := knownInput(tc.dir, m, name)
			if t == nil || tc.known[name] != nil {
				continue
			}
			if tc.known == nil {
				tc.known = map[string]*onnx.Tensor{}
			}
			tc.known[name] = t
			fixed++
		}
		if fixed == 0 {
			break
		}
		mod, ps, err = onnx.Import(m, onnx.Options{Func: tc.fn, ConstLimit: 1 << 12, Known: tc.known})
	}
	if err != nil {
		classify(tc.res, err)
		return
	}
	tc.mod = mod
	for _, in := range m.Inputs {
		tc.inputs = append(tc.inputs, in.GetName())
	}
	tc.order = ps.Names()
	if tc.ps, err = ps.NDArrays(devices.CPUDevice); err != nil {
		tc.res.Status, tc.res.Detail = Failed, err.Error()
	}
}

func classify(r *Result, err error) {
	r.Status, r.Detail = Failed, err.Error()
	if errors.Is(err, onnx.ErrUnsupported) || strings.Contains(err.Error(), "opset") && strings.Contains(err.Error(), "kiln") {
		r.Status = Unsupported
	}
}

// runBatch builds the cases' functions as one module and runs them; when
// the build fails, the batch is split.
func runBatch(ctx context.Context, cases []*testCase, opts Options) {
	// A graph whose outputs were all computed at import has no kernel to
	// build: its outputs are compared as they are.
	cases = slices.DeleteFunc(cases, func(tc *testCase) bool {
		f, _ := tc.mod.Lookup(tc.fn)
		outs := constantOutputs(f.(*ir.Function))
		if outs != nil {
			runConstCase(tc, outs)
		}
		return outs != nil
	})
	if len(cases) == 0 {
		return
	}
	mod := ir.NewIRModule()
	for _, tc := range cases {
		f, _ := tc.mod.Lookup(tc.fn)
		mod = mod.With(tc.fn, f)
	}
	a, err := build(ctx, mod, opts)
	if err != nil {
		if len(cases) == 1 {
			cases[0].res.Status, cases[0].res.Detail = Failed, "build: "+err.Error()
			return
		}
		h := len(cases) / 2
		runBatch(ctx, cases[:h], opts)
		runBatch(ctx, cases[h:], opts)
		return
	}
	m, err := load.Artifact(a, load.Options{})
	if err != nil {
		for _, tc := range cases {
			tc.res.Status, tc.res.Detail = Failed, "load: "+err.Error()
		}
		return
	}
	defer m.Close()
	for _, tc := range cases {
		runCase(tc, m)
	}
}

// constantOutputs returns the outputs of f when they are all constants
// and f computes nothing, else nil.
func constantOutputs(f *ir.Function) []*ir.Constant {
	body := f.Body
	if body == nil || len(body.Blocks) != 1 || len(body.Blocks[0].Bindings) != 1 {
		return nil
	}
	b, ok := body.Blocks[0].Bindings[0].(*ir.VarBinding)
	if !ok {
		return nil
	}
	fields := []ir.RExpr{b.Value}
	if t, ok := b.Value.(*ir.RTuple); ok {
		fields = t.Fields
	}
	var out []*ir.Constant
	for _, e := range fields {
		c, ok := e.(*ir.Constant)
		if !ok {
			return nil
		}
		out = append(out, c)
	}
	return out
}

// runConstCase compares a graph's constant outputs with every data set.
func runConstCase(tc *testCase, outs []*ir.Constant) {
	sets, _ := filepath.Glob(filepath.Join(tc.dir, "test_data_set_*"))
	sort.Strings(sets)
	if len(sets) == 0 {
		tc.res.Status, tc.res.Detail = Failed, "no test_data_set_* directories"
		return
	}
	for _, set := range sets {
		err := func() error {
			wants, err := readTensors(set, "output")
			if err != nil {
				return err
			}
			if len(outs) != len(wants) {
				return fmt.Errorf("%d outputs, want %d", len(outs), len(wants))
			}
			for i, c := range outs {
				if err := compareTensor(&onnx.Tensor{DType: c.DType, Shape: []int64(c.Shape), Data: c.Data}, wants[i]); err != nil {
					return fmt.Errorf("output %d: %w", i, err)
				}
			}
			return nil
		}()
		if err != nil {
			tc.res.Status, tc.res.Detail = Failed, fmt.Sprintf("%s: %v", filepath.Base(set), err)
			return
		}
	}
	tc.res.Status = Passed
}

func build(ctx context.Context, mod *ir.IRModule, opts Options) (a *artifact.Artifact, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic while building: %v", r)
		}
	}()
	return compiler.Build(ctx, mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{NoCache: opts.NoCache})
}

// runCase runs one test on each of its data sets.
func runCase(tc *testCase, m *load.Module) {
	defer func() {
		if r := recover(); r != nil {
			tc.res.Status, tc.res.Detail = Failed, fmt.Sprintf("panic while running: %v", r)
		}
	}()
	sets, _ := filepath.Glob(filepath.Join(tc.dir, "test_data_set_*"))
	sort.Strings(sets)
	if len(sets) == 0 {
		tc.res.Status, tc.res.Detail = Failed, "no test_data_set_* directories"
		return
	}
	for _, set := range sets {
		if err := runSet(tc, m, set); err != nil {
			tc.res.Status, tc.res.Detail = Failed, fmt.Sprintf("%s: %v", filepath.Base(set), err)
			return
		}
	}
	tc.res.Status = Passed
}

func readTensors(set, prefix string) ([]*onnx.Tensor, error) {
	var out []*onnx.Tensor
	for i := 0; ; i++ {
		b, err := os.ReadFile(filepath.Join(set, fmt.Sprintf("%s_%d.pb", prefix, i)))
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		t, err := onnx.ReadTensorProto(b)
		if err != nil {
			return nil, fmt.Errorf("%s_%d.pb: %w", prefix, i, err)
		}
		out = append(out, t)
	}
}

func runSet(tc *testCase, m *load.Module, set string) error {
	ins, err := readTensors(set, "input")
	if err != nil {
		return err
	}
	wants, err := readTensors(set, "output")
	if err != nil {
		return err
	}
	f, _ := tc.mod.Lookup(tc.fn)
	nIn := len(f.(*ir.Function).Params) - len(tc.order)
	if tc.known != nil {
		var rest []*onnx.Tensor
		for i, t := range ins {
			if i < len(tc.inputs) && tc.known[tc.inputs[i]] != nil {
				continue
			}
			rest = append(rest, t)
		}
		ins = rest
	}
	if len(ins) < nIn {
		return fmt.Errorf("%d inputs given, the model takes %d", len(ins), nIn)
	}
	var args []packedfunc.Value
	for _, t := range ins[:nIn] {
		a, err := t.NDArray(devices.CPUDevice)
		if err != nil {
			return err
		}
		args = append(args, packedfunc.Array(a))
	}
	for _, name := range tc.order {
		args = append(args, packedfunc.Array(tc.ps[onnx.VarName(name)]))
	}
	out, err := m.Invoke(tc.fn, args...)
	if err != nil {
		return err
	}
	var got []vm.Value
	if out.IsTuple() {
		got = out.Fields()
	} else {
		got = []vm.Value{out}
	}
	if len(got) != len(wants) {
		return fmt.Errorf("%d outputs, want %d", len(got), len(wants))
	}
	for i, g := range got {
		p, err := g.Packed()
		if err != nil {
			return err
		}
		a, err := p.AsArray()
		if err != nil {
			return fmt.Errorf("output %d: %w", i, err)
		}
		if err := compare(a, wants[i]); err != nil {
			return fmt.Errorf("output %d: %w", i, err)
		}
	}
	return nil
}

// compare checks got against want: same dtype and shape, and every
// element within atol + rtol·|want| (exact for integers and booleans).
func compare(got *ndarray.NDArray, want *onnx.Tensor) error {
	if got.DType() != want.DType {
		return fmt.Errorf("dtype %s, want %s", got.DType(), want.DType)
	}
	gs := []int64(got.Shape())
	if len(gs) != len(want.Shape) {
		return fmt.Errorf("shape %v, want %v", gs, want.Shape)
	}
	for i := range gs {
		if gs[i] != want.Shape[i] {
			return fmt.Errorf("shape %v, want %v", gs, want.Shape)
		}
	}
	b, err := got.Bytes()
	if err != nil {
		return err
	}
	return compareTensor(&onnx.Tensor{DType: got.DType(), Shape: gs, Data: b}, want)
}

// compareTensor is compare of a host tensor.
func compareTensor(g, want *onnx.Tensor) error {
	if g.DType != want.DType || !slices.Equal(g.Shape, want.Shape) {
		return fmt.Errorf("%s%v, want %s%v", g.DType, g.Shape, want.DType, want.Shape)
	}
	const rtol, atol = 1e-3, 1e-7
	if want.DType.IsFloat() {
		gv, wv := g.Floats(), want.Floats()
		for i := range wv {
			if math.IsNaN(wv[i]) && math.IsNaN(gv[i]) || gv[i] == wv[i] {
				continue
			}
			if !(math.Abs(gv[i]-wv[i]) <= atol+rtol*math.Abs(wv[i])) {
				return fmt.Errorf("element %d is %g, want %g", i, gv[i], wv[i])
			}
		}
		return nil
	}
	gv, wv := g.Ints(), want.Ints()
	for i := range wv {
		if gv[i] != wv[i] {
			return fmt.Errorf("element %d is %d, want %d", i, gv[i], wv[i])
		}
	}
	return nil
}
