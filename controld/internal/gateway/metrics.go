package gateway

import (
	"bufio"
	"net"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's instruments; nil fields (no Registerer) count
// nothing.
type metrics struct {
	requests *prometheus.CounterVec
}

// register creates g's instruments in reg: requests by route and HTTP code
// (101: an ACI session spliced or a port's upgrade passed through), and
// gauges read at scrape time.
func (g *Gateway) register(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	g.metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "forkfleet", Subsystem: "controld", Name: "gateway_requests_total",
		Help: "Gateway requests by route (aci, view, port, recording) and HTTP status (101: upgraded; 401: bad token; 429: at gateway.max_sessions; 502/503: the sandbox's side).",
	}, []string{"route", "code"})
	reg.MustRegister(g.metrics.requests,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "gateway_sessions",
			Help: "ACI sessions spliced through the gateway now (each holds two connections).",
		}, func() float64 { return float64(g.Sessions()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "gateway_port_connections",
			Help: "Connections to exposed ports inside sandboxes open now.",
		}, func() float64 { return float64(g.ports.count()) }),
	)
}

// registerServer adds the server's connection gauges (connections not
// upgraded yet, and those closed at gateway.max_handshakes).
func (s *Server) register(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "gateway_handshakes",
			Help: "Gateway connections that have not upgraded (or finished their request) yet.",
		}, func() float64 { return float64(s.handshakes.Handshakes()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "gateway_handshakes_evicted_total",
			Help: "Connections closed short of their upgrade because gateway.max_handshakes were pending.",
		}, func() float64 { return float64(s.handshakes.Evicted()) }),
	)
}

// counted wraps a route's handler to count its responses.
func (g *Gateway) counted(route string, h http.HandlerFunc) http.HandlerFunc {
	if g.metrics.requests == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r)
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		g.metrics.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	}
}

// statusWriter remembers the status a handler wrote; a hijacked connection
// (the ACI upgrade) counts as 101.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return c, rw, err
}

func (w *statusWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController reach the server's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
