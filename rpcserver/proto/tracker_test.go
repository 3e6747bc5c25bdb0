package proto

import (
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestNodeAttrsFlatten(t *testing.T) {
	a := NodeAttrs{
		DeviceTypes: []string{"CUDA", "cpu"},
		MemoryBytes: 8 << 30,
		CUDACompute: "8.6",
		CPUFeatures: []string{"avx2", "avx512f"},
		Targets:     []string{"cuda -arch=sm_86", "cpu"},
		Extra:       map[string]string{"rack": "b3"},
		Triple:      "aarch64-linux-gnu",
		CPUCores:    4,
	}
	got := a.Flatten()
	for k, want := range map[string]string{
		"device.cuda": "true", "device.cpu": "true", "memory.gib": "8",
		"cuda.compute": "8.6", "cpu.avx512": "true", "cpu.avx2": "true",
		"target.cuda": "true", "target.cpu": "true", "rack": "b3",
		"arch": "arm64", "cores": "4", "target": "aarch64-linux-gnu",
	} {
		check.Equal(t, got[k], want, k)
	}
}

func TestTargetKind(t *testing.T) {
	for in, want := range map[string]string{"cuda -arch=sm_80": "cuda", " cpu ": "cpu", "": ""} {
		t.Run(in, func(t *testing.T) { check.Equal(t, TargetKind(in), want) })
	}
}

func TestValidSHA256(t *testing.T) {
	check.NoError(t, ValidSHA256(strings.Repeat("ab", 32)))
	for _, bad := range []string{"", "../x", strings.Repeat("AB", 32), strings.Repeat("a", 63)} {
		t.Run(bad, func(t *testing.T) { check.ErrorIs(t, ValidSHA256(bad), ErrBadRequest) })
	}
}

func TestTrackerTypesRoundTrip(t *testing.T) {
	now := time.Now().Round(0)
	in := LeaseTicket{Ticket: "t1", Position: 3, Lease: &Lease{ID: "l", Expires: now, TTL: time.Minute, Attrs: NodeAttrs{CUDACompute: "9.0"}}}
	b, err := msgpack.Marshal(in)
	check.NoError(t, err)
	var out LeaseTicket
	check.NoError(t, msgpack.Unmarshal(b, &out))
	check.True(t, out.Lease.Expires.Equal(now), "expires")
	out.Lease.Expires = now
	check.Equal(t, out, in)
}
