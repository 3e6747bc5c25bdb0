package cuda

import (
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/transform"
)

// HostDialect is the C dialect of the host functions that launch kernels
// (split by transform.SplitHostDevice, with the packed API): C with, in its
// prelude, one launch function per kernel (transform.LaunchPrefix + the
// kernel's name). Kernel i of kernels is launched as index i through the
// launch hook the CUDA backend stores in the host library when it loads
// the module (abi.DeviceLaunchHook); until then a launch fails saying the
// device code is not loaded.
func HostDialect(kernels []Kernel) (c.Dialect, error) {
	d := c.C()
	var b strings.Builder
	b.WriteString(d.Prelude)
	fmt.Fprintf(&b, `
/* Device code: the CUDA backend stores its launch function and its module
 * here when it loads the artifact's device code. */
typedef int32_t (*kiln_launch_fn)(void* module, int32_t kernel, const int64_t* dims,
                                  int32_t shared_bytes, void** args, char* err, int32_t err_len);
KILN_EXPORT kiln_launch_fn %s = NULL;
KILN_EXPORT void* %s = NULL;

static int32_t kiln_launch(int32_t kernel, const char* name, const int64_t* dims, int32_t shared_bytes, void** args) {
  char msg[1024];
  static const char axis[6][12] = {"blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z"};
  for (int i = 0; i < 6; i++) {
    if (dims[i] < 1 || dims[i] > INT32_MAX) {
      snprintf(msg, sizeof msg, "kernel %%s: %%s extent %%lld is out of range at launch", name, axis[i], (long long)dims[i]);
      kiln_set_last_error(msg);
      return -1;
    }
  }
  kiln_launch_fn launch = __atomic_load_n(&%s, __ATOMIC_ACQUIRE);
  if (launch == NULL) {
    snprintf(msg, sizeof msg, "kernel %%s: the module's device code is not loaded (load this artifact through the cuda backend)", name);
    kiln_set_last_error(msg);
    return -1;
  }
  char err[768];
  err[0] = 0;
  if (launch(%s, kernel, dims, shared_bytes, args, err, (int32_t)sizeof err) != 0) {
    err[sizeof err - 1] = 0;
    snprintf(msg, sizeof msg, "kernel %%s: %%s", name, err);
    kiln_set_last_error(msg);
    return -1;
  }
  return 0;
}
`, abi.DeviceLaunchHook, abi.DeviceModuleSymbol, abi.DeviceLaunchHook, abi.DeviceModuleSymbol)
	for i, k := range kernels {
		ps := []string{"int64_t gx", "int64_t gy", "int64_t gz", "int64_t bx", "int64_t by", "int64_t bz"}
		var refs []string
		for j, p := range k.Params {
			t := "void*"
			if !p.Pointer {
				var ok bool
				if t, ok = scalarC[p.DType]; !ok {
					return c.Dialect{}, fmt.Errorf("kernel %q: parameter %q of type %s cannot be passed to a kernel", k.Name, p.Name, p.DType)
				}
			}
			ps = append(ps, fmt.Sprintf("%s p%d", t, j))
			refs = append(refs, fmt.Sprintf("&p%d", j))
		}
		args := "NULL"
		if len(refs) > 0 {
			fmt.Fprintf(&b, "\nstatic int32_t %s%s(%s) {\n  void* args[%d] = {%s};\n", transform.LaunchPrefix, k.Name, strings.Join(ps, ", "), len(refs), strings.Join(refs, ", "))
			args = "args"
		} else {
			fmt.Fprintf(&b, "\nstatic int32_t %s%s(%s) {\n", transform.LaunchPrefix, k.Name, strings.Join(ps, ", "))
		}
		// Static shared memory is part of the kernel's image: the launch
		// asks only for the dynamic shared memory (shared.dyn buffers).
		fmt.Fprintf(&b, "  const int64_t dims[6] = {gx, gy, gz, bx, by, bz};\n  return kiln_launch(%d, %q, dims, %d, %s);\n}\n", i, k.Name, k.DynSharedBytes, args)
	}
	d.Prelude = b.String()
	d.Externs = c.PackedHelpers()
	for _, k := range kernels {
		d.Externs[transform.LaunchPrefix+k.Name] = true
	}
	return d, nil
}

// scalarC is the C type of a scalar kernel parameter, as the kernel
// declares it.
var scalarC = map[string]string{
	"bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
	"uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
	"float32": "float", "float64": "double",
}
