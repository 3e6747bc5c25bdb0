package cuda

// The default-schedule test against the CPU backend (package cuda_test,
// which may import the compiler) uses the generator's test tools.
var (
	CompileAll    = compileAll
	EmulateBuild  = emulateBuild
	EmulateKernel = emulateKernel
	DecodeFloats  = decodeFloats
	SM80          = sm80
)

// TensorCoreMatmuls is the TVMScript of each matmul TestTensorCoreMatmul
// runs on the tensor cores, by case name (the function is named mm).
func TensorCoreMatmuls() map[string]string {
	srcs := map[string]string{}
	for _, tc := range tensorCoreCases {
		srcs[tc.name] = tensorCoreSource(tc.name, tc.m, tc.n, tc.k, tc.dt, tc.acc, tc.transposed)
	}
	return srcs
}
