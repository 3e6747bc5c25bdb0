package cpu_test

import (
	"testing"

	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// BenchmarkCallVadd4 measures one checked packed call with three small
// NDArrays: the loader's calling path, with almost no kernel work.
func BenchmarkCallVadd4(b *testing.B) {
	path := buildSOB(b, "kernels")
	mod, err := cpu.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	defer mod.Close()
	f, err := mod.GetFunction("vadd")
	if err != nil {
		b.Fatal(err)
	}
	var args [3]packedfunc.Value
	for i := range args {
		a, err := ndarray.FromSlice([]float32{1, 2, 3, 4}, ndarray.Shape{4})
		if err != nil {
			b.Fatal(err)
		}
		args[i] = packedfunc.Array(a)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.Call(args[:]...); err != nil {
			b.Fatal(err)
		}
	}
}
