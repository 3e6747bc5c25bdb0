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

// TestRowConvWideLanes: a row the vectors do not divide takes the widest
// vectors that fit in it all the same, its last run overlapping the one
// before (12 outputs: two runs of 8 lanes, not three of 4), as many
// vectors as take the fewest over the row; the result is the unscheduled
// function's, interpreted and compiled to C.
func TestRowConvWideLanes(t *testing.T) {
	cc := convCase{n: 1, c: 8, h: 5, w: 12, f: 8, kh: 3, kw: 3, stride: 1, pad: 1, oihw: true, epilogue: "bias_relu"}
	p := picks{}
	f := cc.primFunc(t)
	a, err := Apply(f, Options{VectorBytes: 32, VectorRegisters: 16, Decide: p})
	check.NoError(t, err)
	check.Equal(t, a.Rule, RuleRowConv)
	check.Equal(t, p["lanes"], int64(8), p)
	_, asked := p["vectors"]
	check.True(t, !asked, "one vector of 8 is all a row of 12 holds", p)
	sameOutput(t, f, a.Func, 1e-4)
	for _, c := range []struct{ x, lanes, max, want int64 }{
		{56, 16, 4, 2}, {56, 8, 4, 1}, {64, 16, 4, 4}, {28, 16, 4, 1}, {48, 16, 4, 3},
	} {
		check.Equal(t, rowVectors(c.x, c.lanes, c.max), c.want, "row of", c.x, "in vectors of", c.lanes)
	}
	for _, c := range []struct{ x, max, lanes int64 }{{56, 16, 16}, {28, 16, 16}, {12, 16, 8}, {64, 16, 16}, {14, 16, 0}} {
		lanes, ok := rowTile(c.x, c.max)
		if c.lanes == 0 {
			check.True(t, !ok, "a row of", c.x, "that no vector of 4 or more lanes divides takes no tile")
			continue
		}
		check.Equal(t, lanes, c.lanes, "row of", c.x)
	}
	src, funcs := scheduledSource(t, "wide_lanes", []*ir.PrimFunc{f}, []Options{{VectorBytes: 32, VectorRegisters: 16}})
	checkCompiled(t, src, funcs)
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
