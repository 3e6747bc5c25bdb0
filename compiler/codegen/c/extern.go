package c

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// mathFuncs are the C math library's functions of numbers (math.h, and
// CUDA's device math of the same names), each also with its f and l forms:
// the library a call_extern may reach. Functions that take pointers or
// strings (frexp, modf, remquo, nan) are not among them.
var mathFuncs = strings.Fields(`acos asin atan atan2 cos sin tan acosh asinh atanh cosh sinh tanh
	exp exp2 expm1 log log10 log1p log2 logb pow sqrt cbrt hypot erf erfc tgamma lgamma
	ceil floor trunc round lround llround nearbyint rint lrint llrint
	fabs fmod remainder copysign nextafter fdim fmax fmin fma ldexp scalbn ilogb`)

var mathExterns = map[string]bool{}

func init() {
	for _, n := range mathFuncs {
		mathExterns[n] = true
		mathExterns[n+"f"] = true
		mathExterns[n+"l"] = true
	}
}

// AllowExterns lets lowered code call the functions named (the module's
// own, by their C symbol) through call_extern, beside the math library and
// the dialect's Externs.
func (r *Renderer) AllowExterns(names ...string) {
	if r.externs == nil {
		r.externs = map[string]bool{}
	}
	for _, n := range names {
		r.externs[n] = true
	}
}

// checkExtern refuses a call_extern of anything but a declared function:
// a name printed as a call is code, so free text there (a preprocessor
// line, __asm__, _Pragma) would run in the C compiler.
func (r *Renderer) checkExtern(name string) error {
	if !ir.IsCIdentifier(name) {
		return fmt.Errorf("call_extern of %q: a function name must be a C identifier (letters, digits, _)", name)
	}
	if mathExterns[name] || r.d.Externs[name] || r.externs[name] {
		return nil
	}
	own := slices.Sorted(maps.Keys(r.externs))
	ownText := "none"
	if len(own) > 0 {
		ownText = strings.Join(own, ", ")
	}
	return fmt.Errorf("call_extern of %q refused: target %s calls only the C math library (%s, each also with its f and l forms), kiln's helpers (%s) and the module's own functions (%s)",
		name, r.d.Name, strings.Join(mathFuncs, ", "), strings.Join(slices.Sorted(maps.Keys(r.d.Externs)), ", "), ownText)
}
