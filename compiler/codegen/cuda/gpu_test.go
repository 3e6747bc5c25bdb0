package cuda

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	cudadev "github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// onGPU compiles src with NVRTC for GPU 0 of this machine and loads its
// kernels there, and returns a launcher that runs kernel k as
// emulateKernel runs it on the host (bufs are the bytes of each buffer
// parameter of its function in order, scalars are 1.5) and returns the
// buffers' bytes after the launch; nil on a machine without a usable GPU.
// With it the tests that emulate the generated CUDA check it on the real
// device too (scripts/gpu-check runs them there).
func onGPU(t *testing.T, src string, ks []Kernel, fs map[string]*ir.PrimFunc) func(k Kernel, bufs [][]byte) [][]byte {
	t.Helper()
	if ok, _ := cudadev.Available(); !ok {
		return nil
	}
	dev := devices.Device{Type: devices.CUDA, ID: 0}
	api, err := devices.Get(devices.CUDA)
	check.NoError(t, err)
	cc, err := api.Attr(dev, devices.AttrComputeVersion)
	check.NoError(t, err)
	arch := "compute_" + strings.ReplaceAll(cc.(string), ".", "")
	ptx, log, err := cudadev.CompilePTX(src, "kernels.cu", []string{"--gpu-architecture=" + arch})
	check.NoError(t, err, log)
	infos := make([]cudadev.KernelInfo, len(ks))
	for i, k := range ks {
		f := fs[k.Name]
		check.True(t, f != nil, "no function", k.Name)
		infos[i] = cudadev.KernelInfo{Name: k.Name, SharedMem: int(k.DynSharedBytes)}
		for _, p := range f.Params {
			kind := cudadev.ParamPtr
			if _, ok := f.BufferMap[p]; !ok {
				check.Equal(t, p.Type.String(), "float32", "scalar parameter", p.Name)
				kind = cudadev.ParamFloat32
			}
			infos[i].Params = append(infos[i].Params, kind)
		}
	}
	m, err := cudadev.LoadModule(dev, ptx, infos)
	check.NoError(t, err, "load the kernels on ", dev)
	t.Cleanup(func() { check.NoError(t, m.Close()) })
	return func(k Kernel, bufs [][]byte) [][]byte {
		t.Helper()
		for _, g := range k.Grid {
			check.True(t, g > 0, "kernel", k.Name, "has a grid the host computes; it is launched by its host function, not here")
		}
		fn, err := m.GetFunction(k.Name)
		check.NoError(t, err)
		var args []packedfunc.Value
		var arrays []*ndarray.NDArray
		nbuf := 0
		f := fs[k.Name]
		for _, p := range f.Params {
			if _, ok := f.BufferMap[p]; !ok {
				args = append(args, packedfunc.Float(1.5))
				continue
			}
			a, err := ndarray.FromBytes(bufs[nbuf], ndarray.Shape{int64(len(bufs[nbuf]))}, ndarray.Uint8, dev)
			check.NoError(t, err)
			t.Cleanup(func() { a.Release() })
			args = append(args, packedfunc.Array(a))
			arrays = append(arrays, a)
			nbuf++
		}
		for _, d := range append(k.Grid[:], k.Block[:]...) {
			args = append(args, packedfunc.Int(d))
		}
		_, err = fn.Call(args...)
		check.NoError(t, err, "launch ", k.Name, " on ", dev)
		outs := make([][]byte, len(arrays))
		for i, a := range arrays {
			outs[i], err = a.Bytes()
			check.NoError(t, err)
		}
		return outs
	}
}
