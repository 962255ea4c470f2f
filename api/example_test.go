package api_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/controldfake"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Example is the trainer's loop: create a sandbox, act and observe in one
// round trip, checkpoint the state, fork four live replicas of it.
//
// Against a real host, dial controld itself: client.Dial(ctx, "") uses
// unix:///run/forkfleet/controld.sock. To stay runnable anywhere, this
// example serves the in-memory controld fake and a fake guestd.
func Example() {
	ctx := context.Background()
	target, cleanup := fakeHost()
	defer cleanup()

	c, err := client.Dial(ctx, target)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	sb, err := c.CreateSandbox(ctx, client.WithScreen(1280, 800, 24), client.WithWaitReady())
	if err != nil {
		log.Fatal(err)
	}
	s, err := sb.ACI(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	// k actions and the observation after them: one round trip.
	step, err := s.Step(ctx, []*aciv1.Action{aci.Click(640, 400), aci.Type("hello"), aci.Key("Return")}, aci.JPEG(80))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(step.GetOutcomes()), "actions, observed", step.GetObservation().GetFormat())

	ck, err := sb.Checkpoint(ctx, client.WithName("after-hello"))
	if err != nil {
		log.Fatal(err)
	}
	results, err := ck.Fork(ctx, 4, client.WithVerify(controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY))
	if err != nil {
		log.Fatal(err)
	}
	if err := client.FirstError(results); err != nil {
		log.Print(err) // one replica's failure does not fail the others
	}
	fmt.Println(len(client.Sandboxes(results)), "replicas of", ck.Info().GetName())
	// Output:
	// 3 actions, observed IMAGE_FORMAT_JPEG
	// 4 replicas of after-hello
}

// ExampleFrameCache observes a forked fleet through one shared cache: the
// replicas show the same screen, so one full frame serves them all.
func ExampleFrameCache() {
	ctx := context.Background()
	target, cleanup := fakeHost()
	defer cleanup()

	cache := aci.NewFrameCache(0)
	c, err := client.Dial(ctx, target, client.WithACIDialOptions(aci.WithFrameCache(cache)))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	sb, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		log.Fatal(err)
	}
	ck, err := sb.Checkpoint(ctx)
	if err != nil {
		log.Fatal(err)
	}
	results, err := ck.Fork(ctx, 4)
	if err != nil {
		log.Fatal(err)
	}
	for _, replica := range client.Sandboxes(results) {
		s, err := replica.ACI(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := s.Screenshot(ctx, aci.JPEG(80)); err != nil {
			log.Fatal(err)
		}
		s.Close()
	}
	st := cache.Stats()
	fmt.Printf("%d full frame, %d served from the cache\n", st.Misses, st.Hits)
	// Output:
	// 1 full frame, 3 served from the cache
}

// fakeHost serves an in-memory controld whose sandboxes all point at one
// fake guestd, and returns the controld target.
func fakeHost() (target string, cleanup func()) {
	dir, err := os.MkdirTemp("", "forkfleet-example")
	if err != nil {
		log.Fatal(err)
	}
	guest := acitest.NewServer()
	ctl, err := controldfake.Listen(filepath.Join(dir, "controld.sock"))
	if err != nil {
		log.Fatal(err)
	}
	ctl.SetEndpoint(func(*controldv1.Sandbox) *controldv1.Endpoint {
		return &controldv1.Endpoint{Url: guest.URL()}
	})
	return ctl.Target, func() {
		ctl.Close()
		guest.Close()
		os.RemoveAll(dir)
	}
}
