package recording

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// metrics are the recorder's instruments; nil fields (no Registerer) count
// nothing.
type metrics struct {
	bytes   prometheus.Counter
	skipped prometheus.Counter
	stopped *prometheus.CounterVec
}

func (m *Manager) register(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	m.metrics.bytes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "forkfleet", Subsystem: "controld", Name: "recording_bytes_total",
		Help: "Bytes recorders wrote (screencast and trajectory; exports not included).",
	})
	m.metrics.skipped = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "forkfleet", Subsystem: "controld", Name: "recording_frames_skipped_total",
		Help: "Frames recorders skipped to a keyframe because the disk did not keep up.",
	})
	m.metrics.stopped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "forkfleet", Subsystem: "controld", Name: "recordings_stopped_total",
		Help: "Recordings that ended, by reason (requested, cap_reached, sandbox_gone, controld_stopped, failed).",
	}, []string{"reason"})
	reg.MustRegister(m.metrics.bytes, m.metrics.skipped, m.metrics.stopped,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "recordings_running",
			Help: "Sandboxes being recorded now.",
		}, func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			return float64(len(m.active))
		}))
}

// count adds a finished recording's totals.
func (m *Manager) count(rec *controldv1.Recording) {
	if m.metrics.stopped == nil {
		return
	}
	m.metrics.bytes.Add(float64(rec.GetBytes()))
	m.metrics.skipped.Add(float64(rec.GetFramesSkipped()))
	m.metrics.stopped.WithLabelValues(strings.ToLower(strings.TrimPrefix(rec.GetStopReason().String(), "RECORDING_STOP_REASON_"))).Inc()
}
