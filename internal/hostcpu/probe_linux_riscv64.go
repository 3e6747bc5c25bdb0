package hostcpu

import "golang.org/x/sys/unix"

// featuresProbed reports whether the kernel answers riscv_hwprobe, the
// one way to read RISC-V's extensions (the vector extension among them):
// without it (Linux before 6.4, qemu-user before 8.1) the features read
// from HWCAP miss extensions the CPU has.
func featuresProbed() bool {
	pairs := []unix.RISCVHWProbePairs{{Key: 0}}
	return unix.RISCVHWProbe(pairs, nil, 0) == nil
}
