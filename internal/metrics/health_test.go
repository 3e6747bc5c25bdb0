package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestHandleHealth: /healthz is 200 whatever readiness says; /readyz
// follows the ready function, naming the reason when it is not ready.
func TestHandleHealth(t *testing.T) {
	var notReady atomic.Pointer[error]
	mux := http.NewServeMux()
	HandleHealth(mux, func() error {
		if e := notReady.Load(); e != nil {
			return *e
		}
		return nil
	})
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	code, body := get(LivePath)
	check.Equal(t, code, http.StatusOK)
	check.Equal(t, body, "ok\n")
	code, _ = get(ReadyPath)
	check.Equal(t, code, http.StatusOK)

	e := errors.New("store unreachable")
	notReady.Store(&e)
	code, body = get(ReadyPath)
	check.Equal(t, code, http.StatusServiceUnavailable)
	check.True(t, strings.Contains(body, "store unreachable"), body)
	code, _ = get(LivePath)
	check.Equal(t, code, http.StatusOK)
}
