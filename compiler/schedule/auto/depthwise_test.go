package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"

	"github.com/kiln-ml/kiln/internal/check"
)

// rowConvOutRows is a 3×3 convolution in OIHW of the row rule with a
// tile of 4 output channels, its rows inside the spatial loops, and 1
// or 2 output rows (the out_rows choice).
func rowConvOutRows(outRows int64) (convCase, Options) {
	cc := convCase{n: 1, c: 8, h: 6, w: 16, f: 8, kh: 3, kw: 3, stride: 1, pad: 1, oihw: true, epilogue: "bias_relu"}
	return cc, Options{VectorBytes: 32, VectorRegisters: 16, Decide: &fixed{values: map[string]int64{"lanes": 8, "vectors": 1, "rows": 4, "out_rows": outRows, "rows_inner": 1}}}
}

// TestRowConvOutputRows: the row rule's tile may take output rows too
// (each weight broadcast then feeds every row): the choice is asked
// where the channels' tile leaves accumulators for more rows, splits the
// rows, and gives the unscheduled function's result; one row is the
// rule's own pick.
func TestRowConvOutputRows(t *testing.T) {
	for _, rows := range []int64{1, 2} {
		cc, opts := rowConvOutRows(rows)
		f := cc.primFunc(t)
		a, err := Apply(f, opts)
		check.NoError(t, err)
		check.Equal(t, a.Rule, RuleRowConv)
		text := strings.Join(a.Trace, "\n")
		check.Equal(t, strings.Contains(text, "= sch.split(loop=yy, factors=[None, 2])"), rows == 2, "the rows split in the trace:\n", text)
		sameOutput(t, f, a.Func, 1e-4)
	}
	// The default: four channels by two vectors fill the default tile's
	// accumulators, no room for a second row (the choice is not asked).
	p := picks{}
	cc, opts := rowConvOutRows(1)
	opts.Decide = p
	_, err := Apply(cc.primFunc(t), opts)
	check.NoError(t, err)
	check.Equal(t, p["rows"], int64(4), p)
	check.Equal(t, p["vectors"], int64(2), p)
	_, asked := p["out_rows"]
	check.True(t, !asked, "out_rows asked", p)
}

// TestRowConvOutputRowsCompiled compiles the tiles of output rows to C
// and checks them against the interpreter.
func TestRowConvOutputRowsCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	cc1, o1 := rowConvOutRows(1)
	cc2, o2 := rowConvOutRows(2)
	src, funcs := scheduledSource(t, "out_rows", []*ir.PrimFunc{cc1.primFunc(t), cc2.primFunc(t)}, []Options{o1, o2})
	checkCompiled(t, src, funcs)
}
