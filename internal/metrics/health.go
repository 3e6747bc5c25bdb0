package metrics

import (
	"fmt"
	"net/http"
)

// Health probe paths served beside /metrics, for process supervisors such
// as Kubernetes' liveness and readiness probes.
const (
	// LivePath answers 200 while the process serves HTTP at all.
	LivePath = "/healthz"
	// ReadyPath answers 200 while the process can do its work (what that
	// means is the ready function's), 503 with the reason otherwise.
	ReadyPath = "/readyz"
)

// HandleHealth registers LivePath and ReadyPath on mux. ready is called on
// every readiness probe; a non-nil error turns the answer into 503 with
// the error's text as the body.
func HandleHealth(mux *http.ServeMux, ready func() error) {
	mux.HandleFunc(LivePath, func(w http.ResponseWriter, r *http.Request) {
		probeReply(w, nil)
	})
	mux.HandleFunc(ReadyPath, func(w http.ResponseWriter, r *http.Request) {
		probeReply(w, ready())
	})
}

func probeReply(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %v\n", err)
		return
	}
	fmt.Fprintln(w, "ok")
}
