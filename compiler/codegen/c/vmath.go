package c

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Vector math: the calls of math intrinsics on float32 vectors that
// compiler/transform's Vectorize makes (transform.VectorMath) are printed
// as calls of inline helpers computing every lane at once, defined after
// the vector types they use.

// vectorMathHelpers are the helpers' bodies by intrinsic; %[1]s is the
// vector type, %[2]s its mask type (integers of the same width).
var vectorMathHelpers = map[string]string{
	// exp as Cephes' expf (and TVM's fast_exp): x = n·ln2 + r with n
	// the nearest integer to x·log2(e) (the 1.5·2^23 trick rounds and
	// leaves n in the low mantissa bits), ln2 in two parts so r is exact,
	// e^r from a degree-6 polynomial on |r| ≤ ln2/2, then 2^n built in
	// the exponent field, in two halves so that n = ±128 stays in range.
	// Within 2 ulp of expf; above 88.376 it is +inf, below -88.376 zero
	// (expf is subnormal there), NaN stays NaN.
	"exp": `static inline %[1]s kiln_vexp_%[1]s(%[1]s x) {
  const float hi = 88.3762626647949f;
  %[2]s big = x > hi, small = x < -hi, nan = x != x;
  %[1]s c = kiln_vmin_%[1]s(kiln_vmax_%[1]s(x, kiln_bcast_%[1]s(-hi)), kiln_bcast_%[1]s(hi));
  %[1]s t = c * 1.44269504088896341f + 12582912.0f;
  %[1]s n = t - 12582912.0f;
  %[2]s ni = (%[2]s)t - 0x4B400000;
  %[1]s r = c - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  %[1]s p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  %[2]s h = ni >> 1;
  %[1]s y = p * (%[1]s)((h + 127) << 23) * (%[1]s)((ni - h + 127) << 23);
  %[2]s inf = kiln_bcast_%[2]s(0x7F800000);
  %[2]s bits = ((%[2]s)y & ~(big | small | nan)) | (inf & big) | ((%[2]s)x & nan);
  return (%[1]s)bits;
}
`,
	// sigmoid as 1/(1 + e^-x) with the vector exp above (SiLU's and a
	// squeeze-excitation gate's): 0 below -88.4, 1 above 88.4 (e^-x is
	// +inf or zero there), NaN kept.
	"sigmoid": `static inline %[1]s kiln_vsigmoid_%[1]s(%[1]s x) {
  return 1.0f / (1.0f + kiln_vexp_%[1]s(-x));
}
`,
	// erf as x·P(x²)/Q(x²) on x clamped to [-4, 4] (Eigen's and TVM's
	// fast_erf): within 4.1e-7 of erf (7 ulp), ±1 beyond ±4, NaN kept.
	"erf": `static inline %[1]s kiln_verf_%[1]s(%[1]s x) {
  %[2]s nan = x != x;
  %[1]s c = kiln_vmin_%[1]s(kiln_vmax_%[1]s(x, kiln_bcast_%[1]s(-4.0f)), kiln_bcast_%[1]s(4.0f));
  %[1]s x2 = c * c;
  %[1]s p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  %[1]s q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  %[1]s y = c * p / q;
  return (%[1]s)(((%[2]s)y & ~nan) | ((%[2]s)x & nan));
}
`,
}

// vectorMath prints the call of the vector helper of intrinsic op on
// vector type t, or reports that there is none.
func (r *Renderer) vectorMath(op string, t ir.DType, args []string) (string, bool) {
	if r.d.VectorDecl != nil || t.Scalar() != ir.Float32 || vectorMathHelpers[op] == "" || len(args) != 1 {
		return "", false
	}
	r.useVector(t)
	if r.vecMath == nil {
		r.vecMath = map[string]bool{}
	}
	name := fmt.Sprintf("kiln_v%s_%s", op, t)
	r.vecMath[op+" "+t.String()] = true
	if op == "sigmoid" {
		r.vecMath["exp "+t.String()] = true // its helper calls exp's, printed before it
	}
	return name + "(" + args[0] + ")", true
}

// vectorMathDecls prints the helpers vectorMath used.
func (r *Renderer) vectorMathDecls() string {
	keys := make([]string, 0, len(r.vecMath))
	for k := range r.vecMath {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		op, t, _ := strings.Cut(k, " ")
		lanes := strings.TrimPrefix(t, "float32x")
		fmt.Fprintf(&b, vectorMathHelpers[op], t, "int32x"+lanes)
	}
	return b.String()
}
