package store

import (
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestResultsStoreRoundTrip: results written to either store, and deleted
// from it, read back as they were after a reopen.
func TestResultsStoreRoundTrip(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			open := kind.opener(t)
			st, err := open()
			check.NoError(t, err)
			now := time.Now().UTC().Truncate(time.Millisecond)
			r1 := proto.Result{ID: "r-1", Owner: "alice", Recorded: now, Shared: true, Label: "pr-1", Function: "vadd",
				DeviceAttrs: proto.NodeAttrs{CPUFeatures: []string{"avx2"}}, Inputs: []string{"A:float32[256]"},
				Time:    proto.TimeResult{Results: []float64{1e-3, 2e-3, 3e-3}, Report: &proto.TimeReport{Machine: proto.MachineState{CPUs: 8}}},
				Kernels: []proto.KernelTime{{Name: "fused_add", Results: []float64{1e-3}}}}
			r2 := proto.Result{ID: "r-2", Owner: "bob", Recorded: now, Function: "matmul", Time: proto.TimeResult{Results: []float64{5e-3}}}
			check.NoError(t, st.Wait(st.Apply(PutResult(&r1), PutResult(&r2), Put(Results, "r-3", &r2))))
			check.NoError(t, st.Wait(st.Apply(DeleteResult("r-3"))))
			check.NoError(t, st.Close())

			st, err = open()
			check.NoError(t, err)
			defer st.Close()
			snap, err := st.Load()
			check.NoError(t, err)
			results, err := snap.Results()
			check.NoError(t, err)
			check.Equal(t, len(results), 2)
			got := results[0]
			check.Equal(t, got.ID, "r-1")
			check.Equal(t, got.Owner, "alice")
			check.True(t, got.Shared && got.Recorded.Equal(now), got)
			check.Equal(t, got.Label, "pr-1")
			check.Equal(t, got.Time.Results, []float64{1e-3, 2e-3, 3e-3})
			check.True(t, got.Time.Report != nil && got.Time.Report.Machine.CPUs == 8, got.Time.Report)
			check.Equal(t, got.DeviceAttrs.CPUFeatures, []string{"avx2"})
			check.Equal(t, got.Kernels[0].Name, "fused_add")
			check.Equal(t, got.Inputs, []string{"A:float32[256]"})
			check.Equal(t, results[1].Owner, "bob")
		})
	}
}
