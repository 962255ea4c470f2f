//go:build linux

package containerdrt

import (
	"context"
	"fmt"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/typeurl/v2"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Exits delivers the ids of forkfleet sandboxes whose task exited on its
// own (exits caused by Delete, a failed Boot/Restore or Checkpoint with Stop
// are not reported). The channel closes when ctx ends. When the event stream
// breaks (containerd restarted), Exits resubscribes and then reports every
// sandbox found stopped, so an exit may be reported twice but not lost.
func (r *Runtime) Exits(ctx context.Context) (<-chan runtime.Exit, error) {
	nctx := r.ctx(ctx)
	if _, err := r.client.Version(nctx); err != nil {
		return nil, fmt.Errorf("containerd: %w", convertErr(err))
	}
	out := make(chan runtime.Exit, 64)
	go r.exitLoop(nctx, out)
	return out, nil
}

func (r *Runtime) exitLoop(ctx context.Context, out chan<- runtime.Exit) {
	defer close(out)
	filter := fmt.Sprintf(`topic=="/tasks/exit",namespace==%q`, r.cfg.Namespace)
	backoff := 100 * time.Millisecond
	for first := true; ; first = false {
		sctx, cancel := context.WithCancel(ctx)
		envs, errs := r.client.Subscribe(sctx, filter)
		if !first {
			r.reportStopped(ctx, out)
		}
		broken := false
		for !broken {
			select {
			case <-ctx.Done():
				cancel()
				return
			case <-errs:
				broken = true
			case env, ok := <-envs:
				if !ok {
					broken = true
					break
				}
				backoff = 100 * time.Millisecond
				ev, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				te, ok := ev.(*apievents.TaskExit)
				if !ok || te.ID != te.ContainerID { // exec processes are not sandboxes
					continue
				}
				if !r.reportable(ctx, te.ContainerID) {
					continue
				}
				exit := runtime.Exit{ID: te.ContainerID, Status: te.ExitStatus}
				if te.ExitedAt != nil {
					exit.ExitedAt = te.ExitedAt.AsTime()
				}
				select {
				case out <- exit:
				case <-ctx.Done():
					cancel()
					return
				}
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// reportable: a forkfleet sandbox whose exit the runtime did not cause.
func (r *Runtime) reportable(ctx context.Context, id string) bool {
	if r.isQuiet(id) {
		return false
	}
	c, err := r.client.ContainerService().Get(ctx, id)
	return err == nil && c.Labels[labelSandbox] == "true"
}

// reportStopped reports sandboxes whose task stopped while the event
// stream was down.
func (r *Runtime) reportStopped(ctx context.Context, out chan<- runtime.Exit) {
	list, err := r.List(ctx)
	if err != nil {
		return
	}
	for _, inst := range list {
		if inst.Status != runtime.StatusStopped || r.isQuiet(inst.ID) {
			continue
		}
		select {
		case out <- runtime.Exit{ID: inst.ID, ExitedAt: time.Now()}:
		case <-ctx.Done():
			return
		}
	}
}
