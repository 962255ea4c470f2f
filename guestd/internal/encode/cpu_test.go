package encode

import (
	"syscall"
	"testing"
	"time"
)

// cpuTimer reports process CPU time per op next to wall time: on a
// contended host it is the steadier measure of encoder cost (wall time on
// an idle machine is about cpu/GOMAXPROCS for the parallel encoders).
type cpuTimer struct{ start time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuTimer { return cpuTimer{processCPU()} }

func (c cpuTimer) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-c.start)/float64(b.N)/1e6, "cpu-ms/op")
}
