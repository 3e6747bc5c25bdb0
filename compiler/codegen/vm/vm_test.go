package vm

import (
	"os"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/relax/transform"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
	rt "github.com/kiln-ml/kiln/vm"
)

// TestCallCached checks that a lifted weight transform is called through
// vm.builtin.call_cached and other graph functions directly.
func TestCallCached(t *testing.T) {
	src, err := os.ReadFile("../../relax/transform/testdata/mlp_small.py")
	check.NoError(t, err)
	mod, err := script.Parse("mlp_small.py", string(src))
	check.NoError(t, err)
	for _, tc := range []struct {
		pipeline string
		cached   bool
	}{{"zero", false}, {"O2", true}, {"O1", true}, {"O3", false}} {
		t.Run(tc.pipeline, func(t *testing.T) {
			out, err := transform.RunPipeline(mod, tc.pipeline)
			check.NoError(t, err)
			exe, err := Generate(out)
			check.NoError(t, err)
			dis := exe.String()
			check.Equal(t, strings.Contains(dis, rt.BuiltinCallCached), tc.cached, dis)
			if tc.cached {
				_, ok := exe.Function("main_transform_params")
				check.True(t, ok, "main_transform_params is a VM function")
			}
		})
	}
}
