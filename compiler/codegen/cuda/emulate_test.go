package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/exectest"
	"github.com/kiln-ml/kiln/ndarray"
)

// TestEmulate compiles the generated CUDA source of every test kernel with
// the host C++ compiler and testdata/kiln_cuda_emulate.h (threads of a
// block as real threads, blocks in turn), runs each kernel with its launch
// metadata on random inputs, and compares every buffer with the reference
// interpreter's run of the kernel's TensorIR on the same inputs.
func TestEmulate(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("testdata", "kernels.py"))
	check.NoError(t, err)
	orig, err := script.Parse("kernels.py", string(text))
	check.NoError(t, err)
	src, ks, err := Generate(kernelsModule(t), sm80(t))
	check.NoError(t, err)
	emulate(t, orig, src, ks)
}

// emulate runs each kernel ks of the generated src on the host, and on
// this machine's GPU when it has one (see onGPU), and compares its
// buffers with the interpreter's run of the function of the same name in
// ref.
func emulate(t *testing.T, ref *ir.IRModule, src string, ks []Kernel) {
	t.Helper()
	fs := map[string]*ir.PrimFunc{}
	for name, f := range ref.PrimFuncs() {
		fs[name] = f
	}
	bin := emulateBuild(t, src, ks, fs)
	gpu := onGPU(t, src, ks, fs)
	rng := rand.New(rand.NewSource(1))
	for _, k := range ks {
		t.Run(k.Name, func(t *testing.T) {
			f := fs[k.Name]
			check.True(t, f != nil, "no function", k.Name)
			var args []any
			var arrays []*ndarray.NDArray
			var bufs [][]byte
			for _, p := range f.Params {
				b, ok := f.BufferMap[p]
				if !ok {
					check.Equal(t, p.Type.String(), "float32", "scalar parameter", p.Name)
					args = append(args, float32(1.5))
					continue
				}
				half := b.DType.String() == "float16"
				bf16 := b.DType.String() == "bfloat16"
				fp8 := b.DType.IsFloat8()
				check.True(t, half || bf16 || fp8 || b.DType.String() == "float32", "buffer", b.Name, "of", b.DType)
				shape := ndarray.Shape{}
				for _, s := range b.Shape {
					v, ok := ir.IsConstInt(s)
					check.True(t, ok, "buffer", b.Name, "has a symbolic shape")
					shape = append(shape, v)
				}
				data := make([]float32, shape.NumElements())
				for j := range data {
					data[j] = rng.Float32()*2 - 1
				}
				raw := float32Bytes(data)
				if half {
					// Multiples of 1/1024 in [-1, 1]: exact in float16.
					raw = make([]byte, 2*len(data))
					for j := range data {
						data[j] = float32(math.Round(float64(data[j])*1024)) / 1024
						binary.LittleEndian.PutUint16(raw[2*j:], exactHalf(data[j]))
					}
				}
				if bf16 {
					// Multiples of 1/128 in [-1, 1]: exact in bfloat16.
					raw = make([]byte, 2*len(data))
					for j := range data {
						data[j] = float32(math.Round(float64(data[j])*128)) / 128
						binary.LittleEndian.PutUint16(raw[2*j:], uint16(math.Float32bits(data[j])>>16))
					}
				}
				if fp8 {
					// Any of their 8-bit values but NaNs and infinities.
					raw = make([]byte, len(data))
					for j := range data {
						raw[j] = ndarray.Float8Bits(b.DType.Code, float64(data[j])*100)
					}
				}
				a, err := ndarray.FromBytes(append([]byte(nil), raw...), shape, b.DType, devices.CPUDevice)
				check.NoError(t, err)
				args = append(args, a)
				arrays = append(arrays, a)
				bufs = append(bufs, raw)
			}
			check.NoError(t, interp.Run(f, args...))
			compare := func(where string, outs [][]byte) {
				for i, a := range arrays {
					wantRaw, err := a.Bytes()
					check.NoError(t, err)
					want, got := decodeFloats(a.DType(), wantRaw), decodeFloats(a.DType(), outs[i])
					check.Equal(t, len(got), len(want), "buffer", i)
					for j := range want {
						d := math.Abs(float64(got[j]) - float64(want[j]))
						if d > 1e-4*math.Max(1, math.Abs(float64(want[j]))) {
							t.Fatalf("%s: buffer %d element %d: %s %g, interpreter %g", k.Name, i, j, where, got[j], want[j])
						}
					}
				}
			}
			compare("emulated", emulateKernel(t, bin, k, bufs))
			if gpu != nil {
				compare("on the GPU", gpu(k, bufs))
			}
		})
	}
}

// decodeFloats decodes the bytes of an array of float dtype dt.
func decodeFloats(dt ndarray.DType, raw []byte) []float32 {
	switch dt {
	case ndarray.Float16:
		return halfFloats(raw)
	case ndarray.BFloat16:
		return bf16Floats(raw)
	case ndarray.Float8_E4M3, ndarray.Float8_E5M2:
		return float8Floats(dt.Code, raw)
	}
	return bytesFloat32(raw)
}

// emulateBuild compiles one host program for the kernels ks of src with
// testdata/kiln_cuda_emulate.h: its first argument names the kernel to
// launch with its grid and block, the others are files holding the bytes
// of each buffer parameter of the function of that name in fs, rewritten
// after the launch (scalar parameters are 1.5). It skips the test when
// there is no g++.
func emulateBuild(t *testing.T, src string, ks []Kernel, fs map[string]*ir.PrimFunc) (bin string) {
	t.Helper()
	cxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("g++ is not installed: the CUDA source cannot be emulated on the host")
	}
	header, err := os.ReadFile(filepath.Join("testdata", "kiln_cuda_emulate.h"))
	check.NoError(t, err)
	dir := t.TempDir()
	check.NoError(t, os.WriteFile(filepath.Join(dir, "kiln_cuda_emulate.h"), header, 0o644))
	check.NoError(t, os.WriteFile(filepath.Join(dir, "kernels.cu"), []byte(src), 0o644))
	var launches strings.Builder
	for _, k := range ks {
		f := fs[k.Name]
		check.True(t, f != nil, "no function", k.Name)
		var call []string
		nbuf := 0
		for _, p := range f.Params {
			b, ok := f.BufferMap[p]
			if !ok {
				check.Equal(t, p.Type.String(), "float32", "scalar parameter", p.Name)
				call = append(call, "1.5f")
				continue
			}
			ctype := map[string]string{"float32": "float", "float16": "_Float16", "bfloat16": "kiln_bf16"}[b.DType.String()]
			if b.DType.IsFloat8() {
				ctype = c.Float8Type(b.DType)
			}
			check.True(t, ctype != "", "buffer", b.Name, "of", b.DType)
			call = append(call, fmt.Sprintf("(%s*)kiln_buf.at(%d).data()", ctype, nbuf))
			nbuf++
		}
		fmt.Fprintf(&launches, "  if (kernel == %q) { kiln_emulate(dim3{%d, %d, %d}, dim3{%d, %d, %d}, %s, %s); done = true; }\n",
			k.Name, k.Grid[0], k.Grid[1], k.Grid[2], k.Block[0], k.Block[1], k.Block[2], k.Name, strings.Join(call, ", "))
	}
	main := `#include "kiln_cuda_emulate.h"
#include "kernels.cu"
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
int main(int argc, char** argv) {
  std::string kernel = argv[1];
  std::vector<size_t> kiln_size;
  std::vector<std::vector<float>> kiln_buf;  // float-aligned bytes of each buffer
  for (int i = 2; i < argc; i++) {
    std::ifstream in(argv[i], std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<float> v((bytes.size() + sizeof(float) - 1) / sizeof(float));
    std::memcpy(v.data(), bytes.data(), bytes.size());
    kiln_buf.push_back(v);
    kiln_size.push_back(bytes.size());
  }
  bool done = false;
` + launches.String() + `  if (!done) { std::fprintf(stderr, "no kernel %s\n", argv[1]); return 2; }
  for (int i = 2; i < argc; i++) {
    std::ofstream out(argv[i], std::ios::binary | std::ios::trunc);
    out.write((const char*)kiln_buf[i - 2].data(), kiln_size[i - 2]);
    if (!out) { std::perror(argv[i]); return 1; }
  }
  return 0;
}
`
	mainPath := filepath.Join(dir, "main.cpp")
	check.NoError(t, os.WriteFile(mainPath, []byte(main), 0o644))
	bin = filepath.Join(dir, "main")
	out, err := exectest.CombinedOutput(t, 3*time.Minute, exec.Command(cxx, "-std=c++20", "-O1", "-pthread", "-Wno-unknown-pragmas", "-I", dir, "-o", bin, mainPath))
	check.NoError(t, err, string(out))
	return bin
}

// emulateKernel launches kernel k in the program bin (emulateBuild) on
// bufs, the bytes of each buffer parameter of its function in order, and
// returns the buffers' bytes after the launch.
func emulateKernel(t *testing.T, bin string, k Kernel, bufs [][]byte) [][]byte {
	t.Helper()
	kdir := t.TempDir()
	files := make([]string, len(bufs))
	for i, b := range bufs {
		files[i] = filepath.Join(kdir, fmt.Sprintf("p%d.bin", i))
		check.NoError(t, os.WriteFile(files[i], b, 0o644))
	}
	out, err := exectest.CombinedOutput(t, 3*time.Minute, exec.Command(bin, append([]string{k.Name}, files...)...))
	check.NoError(t, err, string(out))
	outs := make([][]byte, len(files))
	for i, file := range files {
		raw, err := os.ReadFile(file)
		check.NoError(t, err)
		outs[i] = raw
	}
	return outs
}

func float32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesFloat32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// exactHalf is the float16 encoding of v, a multiple of 1/1024 in [-1, 1]
// (exact in float16, so no rounding).
func exactHalf(v float32) uint16 {
	if v == 0 {
		return 0
	}
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16(b>>13&0x3ff)
}

// halfFloats decodes float16 values.
func halfFloats(b []byte) []float32 {
	out := make([]float32, len(b)/2)
	for i := range out {
		h := binary.LittleEndian.Uint16(b[2*i:])
		sign := float32(1)
		if h&0x8000 != 0 {
			sign = -1
		}
		exp, man := int(h>>10&0x1f), float64(h&0x3ff)
		switch exp {
		case 0:
			out[i] = sign * float32(math.Ldexp(man, -24))
		case 31:
			out[i] = float32(math.NaN())
			if man == 0 {
				out[i] = sign * float32(math.Inf(1))
			}
		default:
			out[i] = sign * float32(math.Ldexp(1024+man, exp-25))
		}
	}
	return out
}

// float8Floats decodes 8-bit float values of code c.
func float8Floats(c ndarray.Code, b []byte) []float32 {
	out := make([]float32, len(b))
	for i, x := range b {
		out[i] = float32(ndarray.Float8Value(c, x))
	}
	return out
}

// bf16Floats decodes bfloat16 values (the upper halves of float32s).
func bf16Floats(b []byte) []float32 {
	out := make([]float32, len(b)/2)
	for i := range out {
		out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
	}
	return out
}
