package cuda

import (
	"fmt"
	"strings"
)

// Limits are the properties of a CUDA architecture that code generation
// checks kernels against.
type Limits struct {
	// Arch is the architecture, "sm_80".
	Arch string
	// MaxThreadsPerBlock bounds the product of the threadIdx extents.
	MaxThreadsPerBlock int64
	// MaxBlockDim bounds threadIdx.x, .y and .z each.
	MaxBlockDim [3]int64
	// MaxGridDim bounds blockIdx.x, .y and .z each.
	MaxGridDim [3]int64
	// MaxSharedMemPerBlock is the static shared memory a block may use, in
	// bytes (48 KiB; more needs dynamic shared memory opted in at launch).
	MaxSharedMemPerBlock int64
	// MaxSharedMemPerBlockOptin bounds static and dynamic shared memory
	// together, in bytes, once a kernel opts in at launch.
	MaxSharedMemPerBlockOptin int64
	// WarpSize is the number of threads of a warp.
	WarpSize int64
	// MaxRegistersPerThread bounds the registers of one thread.
	MaxRegistersPerThread int64
	// MaxRegistersPerBlock bounds the registers of one block.
	MaxRegistersPerBlock int64
}

// Archs are the architectures kiln generates code for.
var Archs = []string{"sm_80", "sm_86", "sm_89", "sm_90"}

// DefaultArch is the architecture of a target that names none.
const DefaultArch = "sm_80"

// ArchLimits returns the limits of arch (one of Archs).
func ArchLimits(arch string) (Limits, error) {
	var optin int64
	switch arch {
	case "sm_80":
		optin = 163 << 10
	case "sm_86", "sm_89":
		optin = 99 << 10
	case "sm_90":
		optin = 227 << 10
	default:
		return Limits{}, fmt.Errorf("cuda architecture %q is not supported (want one of %s)", arch, strings.Join(Archs, ", "))
	}
	return Limits{
		Arch:                      arch,
		MaxThreadsPerBlock:        1024,
		MaxBlockDim:               [3]int64{1024, 1024, 64},
		MaxGridDim:                [3]int64{1<<31 - 1, 65535, 65535},
		MaxSharedMemPerBlock:      48 << 10,
		MaxSharedMemPerBlockOptin: optin,
		WarpSize:                  32,
		MaxRegistersPerThread:     255,
		MaxRegistersPerBlock:      64 << 10,
	}, nil
}
