package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestTuneRecord: kiln tune --record records each measured candidate in
// the tracker's results store under the run's label, with source "tune"
// and the task's name, which kiln results lists.
func TestTuneRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	f, src, db := tuneProcFleet(t, 1, false)
	_, errOut, err := runApp(t, "tune", src, "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--key", "cpu",
		"--trials", "3", "--batch", "3", "--db", db, "--seed", "1", "--record", "--label", "tune-run-a")
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(errOut, `recorded 3 trials`) && strings.Contains(errOut, `"tune-run-a"`), errOut)
	out, errOut, err := runApp(t, "results", "list", "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--label", "tune-run-a", "--json")
	check.NoError(t, err, errOut)
	var l proto.ResultList
	check.NoError(t, json.Unmarshal([]byte(out), &l), out)
	check.Equal(t, l.Total, 3)
	for _, r := range l.Results {
		check.Equal(t, r.Source, proto.ResultSourceTune)
		check.Equal(t, r.DeviceKey, "cpu")
		check.True(t, r.Function != "" && len(r.Time.Results) > 0 && r.Time.Median > 0 && r.Time.Report != nil, r)
	}

	// --record wants a tracker, and --label wants --record.
	_, _, err = runApp(t, "tune", src, "--trials", "1", "--db", db, "--record")
	check.Error(t, err, "--record needs --tracker")
	_, _, err = runApp(t, "tune", src, "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--trials", "1", "--db", db, "--label", "x")
	check.Error(t, err, "--label and --share go with --record")
}
