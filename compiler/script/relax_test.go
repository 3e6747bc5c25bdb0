package script

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/internal/check"
)

var relaxFuncHeader = regexp.MustCompile(`^\s*@R\.function`)

// relaxFuncTexts splits text into its @R.function texts keyed by name,
// lines trimmed, blank lines and comments dropped.
func relaxFuncTexts(text string) map[string]string {
	out := map[string]string{}
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if !relaxFuncHeader.MatchString(lines[i]) {
			continue
		}
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		var fn []string
		name := ""
		for j := i; j < len(lines); j++ {
			l := lines[j]
			trimmed := strings.TrimSpace(l)
			if trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			if j > i+1 && len(l)-len(strings.TrimLeft(l, " ")) <= indent {
				break
			}
			if strings.HasPrefix(trimmed, "def ") && name == "" {
				name = strings.TrimPrefix(trimmed, "def ")
				name = name[:strings.IndexByte(name, '(')]
			}
			fn = append(fn, trimmed)
		}
		out[name] = strings.Join(fn, "\n")
	}
	return out
}

// TestRelaxPrintMatchesSeeds checks that printing the graph functions of
// TVM's IRModule tutorial gives TVM's own printed text, modulo indentation.
func TestRelaxPrintMatchesSeeds(t *testing.T) {
	for _, file := range []string{"001_after_legalize_ops.py", "001_after_zero_pipeline.py", "001_from_relax.py",
		"001_from_torch.py", "001_main_function.py", "001_tvmscript_shown.py"} {
		m, src := parseFile(t, filepath.Join("testdata", file))
		seed := relaxFuncTexts(src)
		printed := relaxFuncTexts(Print(m))
		check.Equal(t, len(seed), 1, file)
		for name, want := range seed {
			t.Run(file+"/"+name, func(t *testing.T) {
				check.Equal(t, printed[name], want)
			})
		}
	}
}

// TestSeedModulesAgree checks that the IRModule tutorial's hand-written TVMScript
// parses to the module TVM printed for it, and that one function printed
// alone equals the module it came from.
func TestSeedModulesAgree(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"001_tvmscript_source.py", "001_tvmscript_shown.py"},
		{"001_from_torch.py", "001_main_function.py"},
	} {
		t.Run(tc.a, func(t *testing.T) {
			a, _ := parseFile(t, filepath.Join("testdata", tc.a))
			b, _ := parseFile(t, filepath.Join("testdata", tc.b))
			check.True(t, ir.StructuralEqual(a, b), tc.a, "equals", tc.b)
			check.Equal(t, Print(a), Print(b))
		})
	}
	a, _ := parseFile(t, "testdata/001_from_relax.py")
	b, _ := parseFile(t, "testdata/001_tvmscript_shown.py")
	fa, _ := a.Lookup("forward")
	fb, _ := b.Lookup("main")
	check.True(t, !ir.StructuralEqual(fa, fb), "the global symbol differs (forward, main)")
	ga := fa.(*ir.Function).WithAttr(ir.AttrGlobalSymbol, "main")
	check.True(t, ir.StructuralEqual(ga, fb), "otherwise the functions are equal")
}

// TestPrintBuiltRelax prints a graph function built in Go and parses it
// back.
func TestPrintBuiltRelax(t *testing.T) {
	n := ir.NewVar("n", ir.Int64)
	x := ir.NewRVar("x", ir.Tensor(ir.Float32, n, ir.I64(784)))
	w := ir.NewRVar("w", ir.TensorOfShape(ir.Float32, 10, 784))
	lin := op.MustCall("relax.nn.linear", []ir.RExpr{x, w}, nil)
	lv := ir.NewDataflowVar("lv", lin.Info)
	sm := op.MustCall("relax.nn.softmax", []ir.RExpr{lv}, map[string]any{"axis": 1})
	gv := ir.NewRVar("gv", sm.Info)
	body := &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Dataflow: true, Bindings: []ir.Binding{
		&ir.VarBinding{Var: lv, Value: lin}, &ir.VarBinding{Var: gv, Value: sm}}}}, Body: gv}
	f := ir.NewFunction([]*ir.RVar{x, w}, body, map[string]any{ir.AttrGlobalSymbol: "main", "num_input": int64(1)})
	check.NoError(t, ir.VerifyFunction("main", f, nil))
	text := Print(f)
	want := `# from tvm.script import relax as R

@R.function
def main(x: R.Tensor(("n", 784), dtype="float32"), w: R.Tensor((10, 784), dtype="float32")) -> R.Tensor((n, 10), dtype="float32"):
    n = T.int64()
    R.func_attr({"num_input": 1})
    with R.dataflow():
        lv: R.Tensor((n, 10), dtype="float32") = R.nn.linear(x, w, out_dtype="void")
        gv: R.Tensor((n, 10), dtype="float32") = R.nn.softmax(lv, axis=1)
        R.output(gv)
    return gv
`
	check.Equal(t, text, want)
	m, err := Parse("built.py", text)
	check.NoError(t, err)
	g, ok := m.Lookup("main")
	check.True(t, ok)
	check.True(t, ir.StructuralEqual(f, g), "parse(print(f)) equals f")
	check.Equal(t, Print(g), text)
}
