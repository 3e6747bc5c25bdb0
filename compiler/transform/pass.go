package transform

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
)

// Pass is one lowering pass: a function from PrimFunc to PrimFunc.
type Pass struct {
	// Name is the pass's name in dumps and errors ("flatten_buffers").
	Name string
	// Fn runs the pass on one function. It never modifies its argument.
	Fn func(f *ir.PrimFunc) (*ir.PrimFunc, error)
	// Required passes cannot be skipped: later passes or the code
	// generators depend on their output.
	Required bool
}

// passes is the pipeline in order.
var passes = []Pass{
	// lower_init first lowers the cross-thread reductions, which need
	// the blocks' inits.
	{Name: "lower_init", Fn: func(f *ir.PrimFunc) (*ir.PrimFunc, error) {
		f, err := LowerCrossThreadReduction(f)
		if err != nil {
			return nil, err
		}
		return LowerInit(f)
	}, Required: true},
	{Name: "lower_blocks", Fn: LowerBlocks, Required: true},
	{Name: "compact_buffers", Fn: CompactBuffers},
	{Name: "flatten_buffers", Fn: FlattenBuffers, Required: true},
	{Name: "vectorize", Fn: Vectorize, Required: true},
	{Name: "unroll", Fn: Unroll},
	{Name: "partition_loops", Fn: PartitionLoops},
	{Name: "simplify", Fn: Simplify},
	{Name: "vectorize_partitioned", Fn: VectorizePartitioned, Required: true},
	{Name: "storage_rewrite", Fn: StorageRewrite},
	{Name: "make_packed_api", Fn: MakePackedAPI, Required: true},
}

// passOrder lists pairs (a, b): when both run, a must run before b.
var passOrder = [][2]string{
	{"lower_init", "lower_blocks"},
	{"lower_blocks", "flatten_buffers"},
	{"lower_blocks", "compact_buffers"},    // works on Allocate and plain loops
	{"compact_buffers", "flatten_buffers"}, // needs the buffers' dimensions
	{"flatten_buffers", "vectorize"},
	{"lower_blocks", "unroll"},
	{"vectorize", "unroll"},
	{"lower_blocks", "simplify"},
	{"unroll", "partition_loops"}, // unrolled phases make its comparisons constant
	{"partition_loops", "simplify"},
	{"simplify", "vectorize_partitioned"},        // guards of lanes partitioned away first
	{"vectorize_partitioned", "storage_rewrite"}, // vectorized loops are regions
	{"flatten_buffers", "storage_rewrite"},
	{"vectorize", "storage_rewrite"},
	{"unroll", "storage_rewrite"},
	{"flatten_buffers", "make_packed_api"},
	{"vectorize", "make_packed_api"},
	{"unroll", "make_packed_api"},
	{"simplify", "make_packed_api"},
	{"storage_rewrite", "make_packed_api"},
}

func init() {
	if err := checkOrder(passNames(passes)); err != nil {
		panic("transform: pass list: " + err.Error())
	}
	for _, c := range passOrder {
		for _, n := range c {
			if findPass(n) == nil {
				panic(fmt.Sprintf("transform: ordering constraint names unknown pass %q", n))
			}
		}
	}
}

// Passes returns the pipeline, in order.
func Passes() []Pass { return slices.Clone(passes) }

// PassNames returns the names of the pipeline's passes, in order.
func PassNames() []string { return passNames(passes) }

func passNames(ps []Pass) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func findPass(name string) *Pass {
	for i := range passes {
		if passes[i].Name == name {
			return &passes[i]
		}
	}
	return nil
}

// checkOrder reports the first ordering constraint that names violates.
func checkOrder(names []string) error {
	pos := map[string]int{}
	for i, n := range names {
		if _, dup := pos[n]; dup {
			return fmt.Errorf("pass %q runs twice", n)
		}
		pos[n] = i
	}
	for _, c := range passOrder {
		a, okA := pos[c[0]]
		b, okB := pos[c[1]]
		if okA && okB && a > b {
			return fmt.Errorf("pass %q must run before pass %q", c[0], c[1])
		}
	}
	return nil
}

// Options control a lowering run.
type Options struct {
	// DumpAfter names passes after which the function is printed (as
	// TVMScript) to Dump; "all" dumps after every pass.
	DumpAfter []string
	// Dump receives the dumps; nil discards them.
	Dump io.Writer
	// Skip names optional passes not to run.
	Skip []string
	// StopAfter, when set, ends the pipeline after that pass (tests run the
	// interpreter on IR before make_packed_api this way).
	StopAfter string
	// Verify runs ir.Verify after every pass and fails naming the pass
	// that produced ill-formed IR. Tests set it.
	Verify bool
}

// unknownPass is the error for a pass name that is not in the pipeline.
func unknownPass(what, name string) error {
	return fmt.Errorf("%s: unknown pass %q (passes: %s)", what, name, strings.Join(PassNames(), ", "))
}

// ParseDumpIR parses the value of --dump-ir: comma-separated "after:PASS"
// items (PASS may be "all") and returns the pass names.
func ParseDumpIR(spec string) ([]string, error) {
	var out []string
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, ok := strings.CutPrefix(item, "after:")
		if !ok {
			return nil, fmt.Errorf("--dump-ir %q: want after:PASS (passes: %s)", item, strings.Join(PassNames(), ", "))
		}
		if name != "all" && findPass(name) == nil {
			return nil, unknownPass("--dump-ir", name)
		}
		out = append(out, name)
	}
	return out, nil
}

// plan returns the passes an Options selects, in order.
func (o Options) plan() ([]Pass, error) {
	for _, n := range o.DumpAfter {
		if n != "all" && findPass(n) == nil {
			return nil, unknownPass("dump-ir", n)
		}
	}
	for _, n := range o.Skip {
		p := findPass(n)
		if p == nil {
			return nil, unknownPass("skip", n)
		}
		if p.Required {
			return nil, fmt.Errorf("skip: pass %q is required", n)
		}
	}
	if o.StopAfter != "" && findPass(o.StopAfter) == nil {
		return nil, unknownPass("stop after", o.StopAfter)
	}
	var out []Pass
	for _, p := range passes {
		if !slices.Contains(o.Skip, p.Name) {
			out = append(out, p)
		}
		if p.Name == o.StopAfter {
			break
		}
	}
	return out, nil
}

// FuncName is the name a function is reported under: its global_symbol,
// or "main".
func FuncName(f *ir.PrimFunc) string {
	if n, ok := f.Attrs[ir.AttrGlobalSymbol].(string); ok && n != "" {
		return n
	}
	return "main"
}

// Lower runs the pipeline on f.
func Lower(f *ir.PrimFunc, opts Options) (*ir.PrimFunc, error) {
	ps, err := opts.plan()
	if err != nil {
		return nil, err
	}
	return run(f, ps, opts)
}

// Run runs the named passes, in the order given, on f. Names out of the
// pipeline's order panic naming both passes: that is a bug in the caller.
func Run(f *ir.PrimFunc, names []string, opts Options) (*ir.PrimFunc, error) {
	var ps []Pass
	for _, n := range names {
		p := findPass(n)
		if p == nil {
			return nil, unknownPass("run", n)
		}
		ps = append(ps, *p)
	}
	if err := checkOrder(names); err != nil {
		panic("transform: " + err.Error())
	}
	return run(f, ps, opts)
}

func run(f *ir.PrimFunc, ps []Pass, opts Options) (*ir.PrimFunc, error) {
	if f == nil {
		return nil, errors.New("lower: nil function")
	}
	name := FuncName(f)
	for _, p := range ps {
		g, err := runOne(p, f)
		if err != nil {
			return nil, fmt.Errorf("pass %q on function %q: %w", p.Name, name, err)
		}
		f = g
		if opts.Verify {
			if err := ir.Verify(f); err != nil {
				return nil, fmt.Errorf("pass %q on function %q produced ill-formed IR: %w", p.Name, name, err)
			}
		}
		if opts.Dump != nil && (slices.Contains(opts.DumpAfter, p.Name) || slices.Contains(opts.DumpAfter, "all")) {
			fmt.Fprintf(opts.Dump, "# after %s: %s\n%s\n", p.Name, name, script.Print(f))
		}
	}
	return f, nil
}

// runOne runs one pass, turning a panic into an error.
func runOne(p Pass, f *ir.PrimFunc) (g *ir.PrimFunc, err error) {
	defer func() {
		if r := recover(); r != nil {
			g, err = nil, fmt.Errorf("panic: %v", r)
		}
	}()
	g, err = p.Fn(f)
	if err == nil && g == nil {
		err = errors.New("pass returned no function")
	}
	return g, err
}

// LowerModule lowers every PrimFunc of m; other kinds of functions are
// kept as they are. A PrimFunc without a global_symbol gets its name in
// the module as one, so it is exported under that name.
func LowerModule(m *ir.IRModule, opts Options) (*ir.IRModule, error) {
	out := m
	for name, f := range m.PrimFuncs() {
		if n, _ := f.Attrs[ir.AttrGlobalSymbol].(string); n == "" {
			f = f.WithAttr(ir.AttrGlobalSymbol, name)
		}
		g, err := Lower(f, opts)
		if err != nil {
			return nil, err
		}
		out = out.With(name, g)
	}
	return out, nil
}
