package script

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the printer's output")

// inputs returns the seed files and the extra feature files.
func inputs(t testing.TB) []string {
	seeds, err := filepath.Glob("testdata/*.py")
	check.NoError(t, err)
	extra, err := filepath.Glob("testdata/extra/*.py")
	check.NoError(t, err)
	check.True(t, len(seeds) >= 8, "seed files are in testdata")
	return append(seeds, extra...)
}

func parseFile(t testing.TB, path string) (*ir.IRModule, string) {
	t.Helper()
	src, err := os.ReadFile(path)
	check.NoError(t, err)
	m, err := Parse(filepath.Base(path), string(src))
	check.NoError(t, err, path)
	return m, string(src)
}

// TestSeedsParse parses every seed and checks what each holds.
func TestSeedsParse(t *testing.T) {
	want := map[string]struct {
		prim  []string
		relax []string
	}{
		"000_module.py":              {[]string{"add"}, []string{"main"}},
		"001_after_legalize_ops.py":  {[]string{"add", "add1", "matmul", "matmul1", "relu", "transpose", "transpose1"}, []string{"main"}},
		"001_after_zero_pipeline.py": {[]string{"fused_matmul1_add1", "fused_matmul_add_relu", "transpose", "transpose1"}, []string{"main"}},
		"001_from_relax.py":          {nil, []string{"forward"}},
		"001_from_torch.py":          {nil, []string{"main"}},
		"001_main_function.py":       {nil, []string{"main"}},
		"001_tvmscript_shown.py":     {nil, []string{"main"}},
		"001_tvmscript_source.py":    {nil, []string{"main"}},
		"features.py":                {[]string{"vecadd", "features"}, nil},
		"lowered.py":                 {[]string{"lowered"}, nil},
		"relax_features.py":          {[]string{"scale"}, []string{"helper", "main", "stateful"}},
	}
	for _, path := range inputs(t) {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			m, _ := parseFile(t, path)
			var prim, relax []string
			for n, f := range m.Funcs() {
				switch f := f.(type) {
				case *ir.PrimFunc:
					prim = append(prim, n)
					check.NoError(t, ir.Verify(f))
				case *ir.Function:
					relax = append(relax, n)
					check.NoError(t, ir.VerifyFunction(n, f, m))
				}
			}
			w, ok := want[name]
			check.True(t, ok, "expectations for", name)
			check.Equal(t, prim, w.prim)
			check.Equal(t, relax, w.relax)
			check.NoError(t, ir.VerifyModule(m))
		})
	}
}

// TestRoundTrip checks print(parse(print(parse(x)))) == print(parse(x))
// and that the two parses are structurally equal, and compares the text
// with testdata/*.golden (refresh with -update).
func TestRoundTrip(t *testing.T) {
	for _, path := range inputs(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			m1, _ := parseFile(t, path)
			p1 := Print(m1)
			m2, err := Parse("printed.py", p1)
			check.NoError(t, err, "parse printed text:\n"+p1)
			p2 := Print(m2)
			check.Equal(t, p2, p1)
			check.True(t, ir.StructuralEqual(m1, m2), "parse(print(m)) is structurally equal to m")
			check.Equal(t, ir.StructuralHash(m1), ir.StructuralHash(m2))

			golden := strings.TrimSuffix(path, ".py") + ".golden"
			if *update {
				check.NoError(t, os.WriteFile(golden, []byte(p1), 0o644))
			}
			want, err := os.ReadFile(golden)
			check.NoError(t, err, "run go test -update to create", golden)
			check.Equal(t, p1, string(want))
		})
	}
}

var primFuncHeader = regexp.MustCompile(`^\s*@T\.prim_func`)

// primFuncTexts splits TVMScript text into its prim_funcs' texts, each
// with blank lines dropped and every line trimmed.
func primFuncTexts(text string) map[string]string {
	out := map[string]string{}
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if !primFuncHeader.MatchString(lines[i]) {
			continue
		}
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		var fn []string
		name := ""
		for j := i; j < len(lines); j++ {
			l := lines[j]
			trimmed := strings.TrimSpace(l)
			if trimmed == "" {
				continue
			}
			ind := len(l) - len(strings.TrimLeft(l, " "))
			if j > i+1 && ind <= indent && !strings.HasPrefix(trimmed, "#") {
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

// TestPrintMatchesSeeds checks that printing the IRModule tutorial's prim_funcs gives
// TVM's own printed text, modulo whitespace.
func TestPrintMatchesSeeds(t *testing.T) {
	for _, file := range []string{"001_after_legalize_ops.py", "001_after_zero_pipeline.py"} {
		m, src := parseFile(t, filepath.Join("testdata", file))
		seed := primFuncTexts(src)
		printed := primFuncTexts(Print(m))
		check.True(t, len(seed) >= 4, "seed", file, "has prim_funcs")
		for name, want := range seed {
			t.Run(file+"/"+name, func(t *testing.T) {
				check.Equal(t, printed[name], want)
			})
		}
	}
}

func TestStructuralEquality(t *testing.T) {
	src, err := os.ReadFile("testdata/001_after_legalize_ops.py")
	check.NoError(t, err)
	text := string(src)
	m1, err := Parse("a.py", text)
	check.NoError(t, err)
	m2, err := Parse("b.py", text)
	check.NoError(t, err)
	check.True(t, ir.StructuralEqual(m1, m2), "two parses of one text are equal")
	check.Equal(t, ir.StructuralHash(m1), ir.StructuralHash(m2))

	f1 := m1.PrimFunc("matmul")
	for _, tc := range []struct {
		name  string
		from  string
		to    string
		equal bool
	}{
		{"rename loop and block variables", "i0, i1, k", "a, b, c", true},
		{"rename buffers", "inp_0", "x_in", true},
		{"change a constant", "T.float32(0.0)", "T.float32(1.0)", false},
		{"change an extent", "T.int64(784)), \"float32\"), lv", "T.int64(785)), \"float32\"), lv", false},
		{"change the block name", `T.block("matmul")`, `T.block("mm")`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Rewrite only inside the matmul function.
			start := strings.Index(text, "def matmul(")
			end := start + strings.Index(text[start:], "@T.prim_func")
			fn := text[start:end]
			changed := strings.ReplaceAll(fn, tc.from, tc.to)
			if tc.from == "i0, i1, k" {
				changed = regexp.MustCompile(`\bi0\b`).ReplaceAllString(fn, "a")
				changed = regexp.MustCompile(`\bi1\b`).ReplaceAllString(changed, "b")
				changed = regexp.MustCompile(`\bk\b`).ReplaceAllString(changed, "c")
			}
			check.True(t, changed != fn, "the edit applies")
			m3, err := Parse("c.py", text[:start]+changed+text[end:])
			check.NoError(t, err)
			f3 := m3.PrimFunc("matmul")
			check.Equal(t, ir.StructuralEqual(f1, f3), tc.equal)
			check.Equal(t, ir.StructuralHash(f1) == ir.StructuralHash(f3), tc.equal)
			check.Equal(t, ir.StructuralEqual(m1, m3), tc.equal)
		})
	}
}

// TestPrintBuiltIR prints IR built in Go (the way te and the lowering
// passes build it) and parses it back.
func TestPrintBuiltIR(t *testing.T) {
	n := ir.NewVar("n", ir.Int64)
	a := ir.NewBuffer("A", ir.Float32, []ir.Expr{n}, "")
	b := ir.NewBuffer("B", ir.Float32, []ir.Expr{n}, "")
	tmp := ir.NewBuffer("tmp", ir.Float32, []ir.Expr{ir.I64(4)}, "local")
	i := ir.NewVar("i", ir.Int64)
	j := ir.NewVar("j", ir.Int64)
	x := ir.NewVar("x", ir.Float32)
	body := ir.Seq(
		ir.NewFor(i, ir.I64(0), n, ir.ForParallel,
			&ir.Allocate{Buffer: tmp, Body: ir.Seq(
				ir.NewFor(j, ir.I64(0), ir.I64(4), ir.ForVectorized, tmp.Store(ir.Mul(a.Load(i), ir.F32(2)), j)),
				&ir.LetStmt{Var: x, Value: tmp.Load(ir.I64(0)), Body: b.Store(ir.Max(x, ir.F32(0)), i)},
			)}),
		&ir.IfThenElse{Cond: ir.GT(n, ir.I64(0)), Then: b.Store(ir.F32(1), ir.I64(0))},
	)
	f := ir.NewPrimFunc([]*ir.Buffer{a, b}, body, map[string]any{ir.AttrGlobalSymbol: "main", ir.AttrNoAlias: true})
	check.NoError(t, ir.Verify(f))
	text := Print(f)
	want := `# from tvm.script import tir as T

@T.prim_func
def main(var_A: T.handle, var_B: T.handle):
    T.func_attr({"tir.noalias": T.bool(True)})
    n = T.int64()
    A = T.match_buffer(var_A, (n,))
    B = T.match_buffer(var_B, (n,))
    for i in T.parallel(n):
        tmp = T.decl_buffer((T.int64(4),), scope="local")
        for j in T.vectorized(T.int64(4)):
            tmp[j] = A[i] * T.float32(2.0)
        x: T.float32 = tmp[T.int64(0)]
        B[i] = T.max(x, T.float32(0.0))
    if n > T.int64(0):
        B[T.int64(0)] = T.float32(1.0)
`
	check.Equal(t, text, want)
	m, err := Parse("built.py", text)
	check.NoError(t, err)
	g := m.PrimFunc("main")
	check.True(t, g != nil)
	check.True(t, ir.StructuralEqual(f, g), "parse(print(f)) equals f")
	check.Equal(t, Print(g), text)
}
