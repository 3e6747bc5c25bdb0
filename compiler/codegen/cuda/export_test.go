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
