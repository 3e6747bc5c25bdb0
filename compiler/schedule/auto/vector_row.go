package auto

import "github.com/kiln-ml/kiln/compiler/ir"

// VectorRow rewrites fr, when it is the reduction loop of a row
// reduction that vectorRowsOn takes, to accumulate in a local vector of
// vectorBytes (see vectorRowsOn); false when it is not one. The tuner's
// reduction rule applies it loop by loop, with the width it chose.
func VectorRow(fr *ir.For, vectorBytes int64) (ir.Stmt, bool) {
	return vectorRow(fr, vectorBytes)
}
