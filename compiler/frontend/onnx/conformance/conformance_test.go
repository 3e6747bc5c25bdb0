package conformance_test

import (
	"context"
	"os"
	"sort"
	"testing"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/conformance"
)

// suiteDir is ONNX's backend node tests in shared/ beside the repository,
// or $KILN_ONNX_BACKEND_TESTS.
func suiteDir() string {
	if d := os.Getenv("KILN_ONNX_BACKEND_TESTS"); d != "" {
		return d
	}
	return "../../../../../shared/onnx-backend-tests/node"
}

// passFloor is the number of node tests that passed when it was last
// raised: the suite fails if fewer pass, so support cannot silently
// regress. Failing and unsupported tests are counted, not failures.
const passFloor = 868

// TestNodeSuite runs ONNX's backend node tests (922 models) through
// import, build and the VM, and prints passed / failed / unsupported per
// operator (go test -v); KILN_ONNX_FILTER=SUBSTRING runs some of them,
// KILN_ONNX_VERBOSE=1 prints why each unsupported test is.
func TestNodeSuite(t *testing.T) {
	suite := suiteDir()
	if _, err := os.Stat(suite); err != nil {
		t.Skipf("ONNX backend tests not found: %v", err)
	}
	rep, err := conformance.Run(context.Background(), suite, conformance.Options{Filter: os.Getenv("KILN_ONNX_FILTER")})
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for op := range rep.ByOp {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		c := rep.ByOp[op]
		t.Logf("%-28s passed %3d  failed %3d  unsupported %3d", op, c.Passed, c.Failed, c.Unsupported)
	}
	for _, r := range rep.Results {
		if r.Status == conformance.Failed || os.Getenv("KILN_ONNX_VERBOSE") != "" && r.Status != conformance.Passed {
			t.Logf("%s %s: %.300s", r.Status, r.Name, r.Detail)
		}
	}
	t.Logf("total %d: passed %d, failed %d, unsupported %d", rep.Total, rep.Passed, rep.Failed, rep.Unsupported)
	if os.Getenv("KILN_ONNX_FILTER") == "" && rep.Passed < passFloor {
		t.Errorf("%d of %d node tests pass, fewer than the floor of %d", rep.Passed, rep.Total, passFloor)
	}
}
