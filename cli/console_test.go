package cli

import (
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestConsoleRefusesExposure: a console bound beyond loopback on a
// tracker that checks no token is refused before anything listens.
func TestConsoleRefusesExposure(t *testing.T) {
	_, _, err := runApp(t, "tracker", "--data", t.TempDir(), "--ui-listen", "0.0.0.0:0")
	check.Error(t, err, "--ui-listen", "the console on 0.0.0.0:0", "--insecure")
}
