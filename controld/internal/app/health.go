package app

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/health"
)

// healthz answers liveness on the metrics port: 200 while controld's health
// check passes (its loops progress, its store commits, its lock is free;
// what the systemd watchdog pings on), 503 with what failed, or while it
// stops.
func healthz(hc *health.Checker) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st := hc.State(); st == health.Stopping {
			http.Error(w, "stopping", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := hc.Alive(ctx); err != nil {
			http.Error(w, "not alive: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}

// readyz answers readiness as grpc.health.v1 does: 200 once startup
// reconciliation is done (serving), 503 before (starting) and from the
// start of shutdown (stopping).
func readyz(hc *health.Checker) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := hc.State()
		if st != health.Serving {
			http.Error(w, st.String(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, st)
	})
}
