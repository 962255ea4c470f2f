package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/health"
)

// wait serves until ctx ends or a listener fails, and returns that
// failure.
func (d *controld) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		d.log.Info("controld shutting down", "cause", context.Cause(ctx))
		return nil
	case err := <-d.serveErr:
		d.log.Error("controld: a listener failed; shutting down", "err", err)
		return err
	}
}

// shutdownStep is one named step of controld's ordered shutdown.
type shutdownStep struct {
	name string
	fn   func(ctx context.Context) error
}

// shutdown says controld is stopping, then runs the shutdown steps in
// order, all within cfg.ShutdownTimeout, and returns what failed.
func (d *controld) shutdown() []error {
	d.announceStopping()
	deadline := time.Now().Add(d.cfg.ShutdownTimeout.D())
	var errs []error
	for _, s := range d.shutdownSteps() {
		sctx, cancel := context.WithDeadline(context.Background(), deadline)
		start := time.Now()
		err := s.fn(sctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("shutdown %s: %w", s.name, err))
		}
		d.log.Info("shutdown step", "step", s.name, "took", time.Since(start), "err", err)
	}
	if p := d.cfg.GRPC.UnixSocket; p != "" {
		os.Remove(p)
	}
	return errs
}

// announceStopping says controld is stopping: health NOT_SERVING (to
// checks and watches alike), systemd STOPPING=1. systemd stops watching
// once the unit is stopping; so does controld.
func (d *controld) announceStopping() {
	d.hc.SetState(health.Stopping)
	d.gsrv.Stopping()
	d.stopWatchdog()
	<-d.wdDone
	if err := sdNotify("STOPPING=1\nSTATUS=stopping"); err != nil {
		d.log.Warn("sd_notify STOPPING", "err", err)
	}
}

// shutdownSteps are the steps of the shutdown, in order: the API first,
// the store last.
func (d *controld) shutdownSteps() []shutdownStep {
	steps := []shutdownStep{
		{"stop accepting gRPC", d.stopAccepting},
		{"drain in-flight gRPC calls", d.drainGRPC},
		// Recordings end first: their files are closed and marked stopped
		// while the gateway still feeds them.
		{"stop recordings", func(context.Context) error { d.recs.Close(); return nil }},
		{"stop gateway", d.gwServer.Shutdown},
		{"stop pool replenishers and reapers", d.mgr.Close},
	}
	if d.msrv != nil {
		steps = append(steps, shutdownStep{"stop metrics", d.msrv.Shutdown})
	}
	return append(steps,
		shutdownStep{"flush traces", d.tr.Shutdown},
		shutdownStep{"close store", func(context.Context) error { return d.st.Close() }},
	)
}

// stopAccepting closes the gRPC listeners and ends the watches: streams
// would hold GracefulStop until the deadline; clients re-watch on the
// restarted controld.
func (d *controld) stopAccepting(context.Context) error {
	for _, ln := range []net.Listener{d.unixLn, d.tcpLn} {
		if ln != nil {
			ln.Close()
		}
	}
	d.mgr.CloseWatches()
	return nil
}

// drainGRPC lets the calls in flight finish, and cuts off those left at
// the deadline.
func (d *controld) drainGRPC(ctx context.Context) error {
	done := make(chan struct{})
	go func() { d.gsrv.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		d.gsrv.Stop()
		<-done
		return errors.New("deadline reached: remaining calls cut off")
	}
}
