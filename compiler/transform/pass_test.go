package transform

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func pipelineModule(t *testing.T) *ir.IRModule {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "pipeline.py"))
	check.NoError(t, err)
	m, err := script.Parse("pipeline.py", string(src))
	check.NoError(t, err)
	return m
}

// TestPipelineGolden lowers each function of testdata/pipeline.py with
// Verify after every pass, and compares the IR printed after each pass
// with testdata/NAME.golden: the printer's text is the contract.
func TestPipelineGolden(t *testing.T) {
	m := pipelineModule(t)
	for name, f := range m.PrimFuncs() {
		t.Run(name, func(t *testing.T) {
			var dump bytes.Buffer
			_, err := Lower(f, Options{Verify: true, DumpAfter: []string{"all"}, Dump: &dump})
			check.NoError(t, err)
			path := filepath.Join("testdata", name+".golden")
			if *update {
				check.NoError(t, os.WriteFile(path, dump.Bytes(), 0o644))
			}
			want, err := os.ReadFile(path)
			check.NoError(t, err, "run go test -update")
			check.Equal(t, dump.String(), string(want))
		})
	}
}

func TestPassOrder(t *testing.T) {
	check.NoError(t, checkOrder(PassNames()))
	f := pipelineModule(t).PrimFunc("matmul")
	t.Run("out of order panics naming both", func(t *testing.T) {
		defer func() {
			r := recover()
			check.True(t, r != nil, "Run must panic")
			msg := fmt.Sprint(r)
			check.True(t, strings.Contains(msg, `"lower_blocks"`) && strings.Contains(msg, `"flatten_buffers"`), msg)
		}()
		_, _ = Run(f, []string{"lower_init", "flatten_buffers", "lower_blocks"}, Options{})
	})
	t.Run("in order", func(t *testing.T) {
		g, err := Run(f, []string{"lower_init", "lower_blocks", "flatten_buffers"}, Options{Verify: true})
		check.NoError(t, err)
		check.True(t, g != f)
	})
}

func TestOptionsErrors(t *testing.T) {
	f := pipelineModule(t).PrimFunc("matmul")
	tests := []struct {
		name string
		opts Options
		want []string
	}{
		{"unknown dump", Options{DumpAfter: []string{"nope"}}, []string{`unknown pass "nope"`, "lower_init, lower_blocks"}},
		{"unknown skip", Options{Skip: []string{"nope"}}, []string{`unknown pass "nope"`}},
		{"skip required", Options{Skip: []string{"flatten_buffers"}}, []string{`pass "flatten_buffers" is required`}},
		{"unknown stop", Options{StopAfter: "nope"}, []string{`unknown pass "nope"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Lower(f, tt.opts)
			check.Error(t, err, tt.want...)
		})
	}
	t.Run("parse dump-ir", func(t *testing.T) {
		got, err := ParseDumpIR("after:simplify,after:all")
		check.NoError(t, err)
		check.Equal(t, got, []string{"simplify", "all"})
		_, err = ParseDumpIR("before:simplify")
		check.Error(t, err, "want after:PASS")
		_, err = ParseDumpIR("after:simplfy")
		check.Error(t, err, `unknown pass "simplfy"`, "storage_rewrite")
	})
}

func TestPassPanicBecomesError(t *testing.T) {
	f := pipelineModule(t).PrimFunc("matmul")
	boom := Pass{Name: "boom", Fn: func(*ir.PrimFunc) (*ir.PrimFunc, error) { panic("index out of range") }}
	_, err := run(f, []Pass{boom}, Options{})
	check.Error(t, err, `pass "boom"`, `function "matmul"`, "panic: index out of range")
	nilPass := Pass{Name: "nil", Fn: func(*ir.PrimFunc) (*ir.PrimFunc, error) { return nil, nil }}
	_, err = run(f, []Pass{nilPass}, Options{})
	check.Error(t, err, `pass "nil"`, "no function")
	bad := Pass{Name: "bad", Fn: func(f *ir.PrimFunc) (*ir.PrimFunc, error) {
		return f.WithBody(&ir.Evaluate{Value: ir.NewVar("ghost", ir.Int32)}), nil
	}}
	_, err = run(f, []Pass{bad}, Options{Verify: true})
	check.Error(t, err, `pass "bad"`, "ill-formed", `"ghost"`)
	check.True(t, errors.Is(err, ir.ErrIllFormed))
}

func TestStopAfterAndSkip(t *testing.T) {
	f := pipelineModule(t).PrimFunc("blocked")
	g, err := Lower(f, Options{StopAfter: "storage_rewrite", Verify: true})
	check.NoError(t, err)
	check.True(t, g.Attrs[AttrCallingConv] == nil, "make_packed_api did not run")
	check.Equal(t, len(g.Params), 3)
	h, err := Lower(f, Options{Skip: []string{"unroll", "simplify", "storage_rewrite"}, Verify: true})
	check.NoError(t, err)
	check.Equal(t, h.Attrs[AttrCallingConv], any(CallingConvPacked))
	unrolled := 0
	ir.Visit(h.Body, func(n ir.Node) bool {
		if fr, ok := n.(*ir.For); ok && fr.Kind == ir.ForUnrolled {
			unrolled++
		}
		return true
	})
	check.True(t, unrolled > 0, "skipped unroll leaves unrolled loops")
}
