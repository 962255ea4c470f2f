//go:build linux

package suites

import (
	"context"
	"flag"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// actionSuite measures single ACI round trips on a 1280x800 desktop and, in
// the same run on the same display, the per-action process spawns and
// screenshot pipelines a user would otherwise use.
type actionSuite struct {
	inputN, shotN, peerN int
}

func (*actionSuite) Name() string { return "action" }
func (*actionSuite) Description() string {
	return "ACI round trips (ping, move, click, key, type, screenshots, if_none_match, click+PNG step) vs xdotool/import/xwd on the same display"
}

func (a *actionSuite) Flags(fs *flag.FlagSet) {
	fs.IntVar(&a.inputN, "action-input-n", 300, "samples per input op (--n overrides)")
	fs.IntVar(&a.shotN, "action-shot-n", 150, "samples per screenshot cell (--n overrides)")
	fs.IntVar(&a.peerN, "action-peer-n", 100, "samples per peer cell (--n overrides)")
}

func (a *actionSuite) Check(ctx context.Context, env *suiteapi.Env) error { return checkHostGuest(env) }

// Peers: a fresh process per action or screenshot, as OSWorld-style servers
// drive a desktop.
func (a *actionSuite) Peers() []string { return []string{"xdotool", "import", "convert", "xwd"} }

// Where input lands: the root background in the sparse scene.
const rootX, rootY = 1100, 700

func (a *actionSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	hg, err := startHostGuest(ctx, env)
	if err != nil {
		return nil, err
	}
	defer hg.Stop()
	xdotool, haveXdotool := env.Peer("xdotool")
	imImport, haveImport := env.Peer("import")
	imConvert, haveConvert := env.Peer("convert")
	xwd, haveXwd := env.Peer("xwd")
	nIn, nShot, nPeer, warm := env.Samples(a.inputN), env.Samples(a.shotN), env.Samples(a.peerN), env.Warmups(5)
	s := hg.Session
	var rows []result.Row
	p50 := map[string]float64{} // for the same-run ratios

	emit := func(ser ...*result.Series) {
		for _, x := range ser {
			r := x.Row()
			rows = append(rows, r)
			if r.P50 != nil {
				p50[r.Key()+fmt.Sprint(r.Baseline)] = *r.P50
			}
		}
	}
	span := func(ctx context.Context, name string, kv ...attribute.KeyValue) (context.Context, oteltrace.Span) {
		return env.Tracer.Start(ctx, name, oteltrace.WithAttributes(kv...))
	}

	for _, sc := range harness.Scenes {
		if err := hg.Desktop.SetScene(ctx, sc, env.WorkDir); err != nil {
			return nil, err
		}
		content := string(sc)
		env.Progressf("action: scene %s", content)
		// Screenshots follow a one-pixel repaint (capture and encode, not
		// guestd's cache of an unchanged frame, which the unchanged cell
		// measures).
		touch, err := hg.Desktop.NewToucher()
		if err != nil {
			return nil, err
		}
		for _, f := range []struct {
			name string
			req  *aciv1.ScreenshotRequest
		}{{"png", aci.PNG()}, {"jpeg-q80", aci.JPEG(80)}} {
			cctx, sp := span(ctx, "action.screenshot", attribute.String("content", content), attribute.String("format", f.name))
			lat := result.NewSeries("action.screenshot", "ms", labels("content", content, "format", f.name))
			size := result.NewSeries("action.bytes", "bytes", labels("op", "screenshot", "content", content, "format", f.name))
			err := suiteapi.Measure(cctx, lat, warm, nShot, func(warm bool) (float64, error) {
				if err := touch.Touch(); err != nil {
					return 0, err
				}
				w0 := hg.Wire.Total()
				t0 := time.Now()
				r, err := s.Screenshot(cctx, f.req)
				d := time.Since(t0)
				if err != nil {
					return 0, err
				}
				if !validImage(f.name, r) {
					return 0, suiteapi.ErrUnverified
				}
				if !warm {
					size.Add(float64(hg.Wire.Total() - w0))
				}
				return suiteapi.Ms(d), nil
			})
			sp.End()
			if err != nil {
				touch.Close()
				return nil, err
			}
			emit(lat, size)
		}
		touch.Close()
		// An unchanged screen asked with if_none_match: no pixels travel.
		if r, err := s.Screenshot(ctx, aci.PNG()); err == nil && len(r.GetFrameHash()) > 0 {
			hash := r.GetFrameHash()
			lat := result.NewSeries("action.screenshot_unchanged", "ms", labels("content", content, "format", "png"))
			size := result.NewSeries("action.bytes", "bytes", labels("op", "screenshot_unchanged", "content", content, "format", "png"))
			cctx, sp := span(ctx, "action.screenshot_unchanged", attribute.String("content", content))
			err := suiteapi.Measure(cctx, lat, warm, nShot, func(warm bool) (float64, error) {
				w0 := hg.Wire.Total()
				t0 := time.Now()
				r, err := s.Screenshot(cctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, IfNoneMatch: hash})
				d := time.Since(t0)
				if err != nil {
					return 0, err
				}
				if !r.GetNotModified() || len(r.GetData()) != 0 {
					return 0, suiteapi.ErrUnverified
				}
				if !warm {
					size.Add(float64(hg.Wire.Total() - w0))
				}
				return suiteapi.Ms(d), nil
			})
			sp.End()
			if err != nil {
				return nil, err
			}
			emit(lat, size)
		} else {
			env.Notef("if_none_match cell on %s not measured: first screenshot failed or had no frame_hash (%v)", content, err)
		}
		// One step: click, then the full PNG observation, one round trip.
		{
			lat := result.NewSeries("action.click_png_step", "ms", labels("content", content))
			size := result.NewSeries("action.bytes", "bytes", labels("op", "click_png_step", "content", content))
			cctx, sp := span(ctx, "action.click_png_step", attribute.String("content", content))
			err := suiteapi.Measure(cctx, lat, warm, nShot, func(warm bool) (float64, error) {
				w0 := hg.Wire.Total()
				t0 := time.Now()
				r, err := s.Step(cctx, []*aciv1.Action{aci.Click(1270, 790)}, aci.PNG())
				d := time.Since(t0)
				if err != nil {
					return 0, err
				}
				if e := stepErr(r, 1); e != nil {
					return 0, e
				}
				if !validImage("png", r.GetObservation()) {
					return 0, suiteapi.ErrUnverified
				}
				if !warm {
					size.Add(float64(hg.Wire.Total() - w0))
				}
				return suiteapi.Ms(d), nil
			})
			sp.End()
			if err != nil {
				return nil, err
			}
			emit(lat, size)
		}
		// Peers on the same scene.
		envX := hg.Desktop.Env()
		if haveImport {
			lat := result.NewSeries("peer.import_png", "ms", labels("content", content))
			size := result.NewSeries("peer.bytes", "bytes", labels("op", "import_png", "content", content))
			lat.Baseline, size.Baseline = true, true
			err := suiteapi.Measure(ctx, lat, min(warm, 2), nPeer, func(warm bool) (float64, error) {
				out, d, err := runTimed(ctx, envX, imImport, "-window", "root", "png:-")
				if err != nil {
					return 0, err
				}
				if !isPNG(out) {
					return 0, suiteapi.ErrUnverified
				}
				if !warm {
					size.Add(float64(len(out)))
				}
				return suiteapi.Ms(d), nil
			})
			if err != nil {
				return nil, err
			}
			emit(lat, size)
		}
		if haveXwd && haveConvert {
			lat := result.NewSeries("peer.xwd_convert_png", "ms", labels("content", content))
			size := result.NewSeries("peer.bytes", "bytes", labels("op", "xwd_convert_png", "content", content))
			lat.Baseline, size.Baseline = true, true
			err := suiteapi.Measure(ctx, lat, min(warm, 2), nPeer, func(warm bool) (float64, error) {
				out, d, err := runPipeTimed(ctx, envX, []string{xwd, "-root", "-silent"}, []string{imConvert, "xwd:-", "png:-"})
				if err != nil {
					return 0, err
				}
				if !isPNG(out) {
					return 0, suiteapi.ErrUnverified
				}
				if !warm {
					size.Add(float64(len(out)))
				}
				return suiteapi.Ms(d), nil
			})
			if err != nil {
				return nil, err
			}
			emit(lat, size)
		}
	}

	// Input plane, on the sparse desktop.
	if err := hg.Desktop.SetScene(ctx, harness.SceneSparse, env.WorkDir); err != nil {
		return nil, err
	}
	env.Progressf("action: input plane")
	type op struct {
		name string
		do   func(ctx context.Context, i int) error
	}
	one := func(ctx context.Context, act *aciv1.Action) error {
		r, err := s.Step(ctx, []*aciv1.Action{act}, nil)
		if err != nil {
			return err
		}
		return stepErr(r, 1)
	}
	ops := []op{
		{"ping", func(ctx context.Context, i int) error { _, err := s.Ping(ctx, nil); return err }},
		{"move", func(ctx context.Context, i int) error { return one(ctx, aci.Move(rootX+i%2*20, rootY)) }},
		{"click", func(ctx context.Context, i int) error { return one(ctx, aci.Click(rootX, rootY)) }},
		{"key", func(ctx context.Context, i int) error { return one(ctx, aci.Key("a")) }},
		{"type_1_char", func(ctx context.Context, i int) error { return one(ctx, aci.Type("a")) }},
	}
	for _, o := range ops {
		lat := result.NewSeries("action."+o.name, "ms", nil)
		size := result.NewSeries("action.bytes", "bytes", labels("op", o.name))
		cctx, sp := span(ctx, "action."+o.name)
		i := 0
		err := suiteapi.Measure(cctx, lat, warm, nIn, func(warm bool) (float64, error) {
			i++
			w0 := hg.Wire.Total()
			t0 := time.Now()
			if err := o.do(cctx, i); err != nil {
				return 0, err
			}
			d := time.Since(t0)
			if !warm {
				size.Add(float64(hg.Wire.Total() - w0))
			}
			return suiteapi.Ms(d), nil
		})
		sp.End()
		if err != nil {
			return nil, err
		}
		emit(lat, size)
	}
	envX := hg.Desktop.Env()
	peerOps := []struct {
		name string
		argv []string
	}{
		{"true", []string{"/bin/true"}},
		{"xdotool_mousemove", []string{xdotool, "mousemove", itoa(rootX), itoa(rootY)}},
		{"xdotool_click", []string{xdotool, "click", "--delay", "0", "1"}},
		{"xdotool_key", []string{xdotool, "key", "--delay", "0", "a"}},
	}
	for _, p := range peerOps {
		if p.name != "true" && !haveXdotool {
			continue
		}
		lat := result.NewSeries("peer."+p.name, "ms", nil)
		lat.Baseline = true
		err := suiteapi.Measure(ctx, lat, min(warm, 2), max(nPeer, min(nIn, 100)), func(warm bool) (float64, error) {
			_, d, err := runTimed(ctx, envX, p.argv...)
			return suiteapi.Ms(d), err
		})
		if err != nil {
			return nil, err
		}
		emit(lat)
	}

	// Same-run ratios: peer p50 over ours.
	ratio := func(name, ours, peer string) {
		o, ok1 := p50[ours+"false"]
		p, ok2 := p50[peer+"true"]
		if ok1 && ok2 && o > 0 {
			rows = append(rows, result.Single("action.speedup_vs_peer", "x", labels("cell", name), p/o))
		}
	}
	ratio("move vs xdotool mousemove", "action.move", "peer.xdotool_mousemove")
	ratio("click vs xdotool click --delay 0", "action.click", "peer.xdotool_click")
	ratio("key vs xdotool key --delay 0", "action.key", "peer.xdotool_key")
	for _, sc := range harness.Scenes {
		c := string(sc)
		ratio("png "+c+" vs import", "action.screenshot content="+c+" format=png", "peer.import_png content="+c)
		ratio("png "+c+" vs xwd|convert", "action.screenshot content="+c+" format=png", "peer.xwd_convert_png content="+c)
	}
	return rows, nil
}

// validImage checks a screenshot reply really carries an image of format.
func validImage(format string, r *aciv1.ScreenshotResponse) bool {
	if r == nil || r.GetNotModified() {
		return false
	}
	d := r.GetData()
	ok := isPNG(d)
	if format != "png" {
		ok = isJPEG(d)
	}
	return ok && r.GetWidth() > 0 && r.GetHeight() > 0
}

// stepErr returns the first failed action or observation of a step reply.
func stepErr(r *aciv1.StepResponse, actions int) error {
	if len(r.GetOutcomes()) != actions {
		return fmt.Errorf("step: %d outcomes for %d actions", len(r.GetOutcomes()), actions)
	}
	for i, o := range r.GetOutcomes() {
		if e := o.GetError(); e != nil {
			return fmt.Errorf("step action %d: %s", i, e.GetMessage())
		}
	}
	if e := r.GetObservationError(); e != nil {
		return fmt.Errorf("step observation: %s", e.GetMessage())
	}
	return nil
}
