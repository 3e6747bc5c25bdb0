package c

import (
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestRegisterSlots checks which local allocations are kept in variables:
// only those whose every access is at a constant index or a constant-based
// stride-1 ramp, without partial overlaps.
func TestRegisterSlots(t *testing.T) {
	tests := []struct {
		name string
		body string // statements using t (16 float32, scope from the name)
		want map[int64]int
	}{
		{"vectors", `
    t[T.Ramp(0, 1, 8)] = T.Broadcast(T.float32(0), 8)
    t[T.Ramp(8, 1, 8)] = t[T.Ramp(0, 1, 8)]
    A[T.Ramp(0, 1, 8)] = t[T.Ramp(8, 1, 8)]`, map[int64]int{0: 8, 8: 8}},
		{"scalars", `
    t[3] = A[0]
    A[1] = t[3]`, map[int64]int{3: 1}},
		{"dynamic index", `
    for i in range(16):
        t[i] = A[i]
    A[0] = t[3]`, nil},
		{"partial overlap", `
    t[T.Ramp(0, 1, 8)] = T.Broadcast(T.float32(0), 8)
    A[T.Ramp(0, 1, 8)] = t[T.Ramp(4, 1, 8)]`, nil},
		{"same base, other width", `
    t[T.Ramp(0, 1, 8)] = T.Broadcast(T.float32(0), 8)
    A[T.Ramp(0, 1, 4)] = t[T.Ramp(0, 1, 4)]`, nil},
		{"strided", `
    A[T.Ramp(0, 1, 4)] = t[T.Ramp(0, 2, 4)]`, nil},
		{"out of bounds", `
    A[T.Ramp(0, 1, 8)] = t[T.Ramp(12, 1, 8)]`, nil},
	}
	for _, scope := range []string{"local", "global"} {
		for _, tt := range tests {
			t.Run(scope+"/"+tt.name, func(t *testing.T) {
				src := `# from tvm.script import tir as T
@T.prim_func
def f(A: T.Buffer((16,), "float32")):
    t = T.decl_buffer((16,), scope="` + scope + `")` + tt.body + "\n"
				m, err := script.Parse("f.py", src)
				check.NoError(t, err)
				a, ok := m.PrimFunc("f").Body.(*ir.Allocate)
				check.True(t, ok, "body is not an allocation")
				got := registerSlots(a.Buffer, a.Body)
				if scope != "local" {
					check.True(t, got == nil, "a", scope, "buffer was promoted")
					return
				}
				check.Equal(t, got, tt.want)
			})
		}
	}
}
