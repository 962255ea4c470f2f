//go:build linux

package suites

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/draw"
	"image/png"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/desktoptest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/screencast"
	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/rfb"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

// typingText is what the typing workload types, 12 characters a second.
const typingText = "forkfleet benchmarks type this line "

const typingInterval = time.Second / 12

// typist types into the focused xterm through its own ACI session. When
// keys is set, it publishes each key's injection time there right before
// the Step carrying it is sent, so an update can never arrive before the
// key it answers is known.
type typist struct {
	s    *aci.Session
	keys chan<- time.Time
}

func (t *typist) run(ctx context.Context) error {
	tick := time.NewTicker(typingInterval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		ch := string(typingText[i%len(typingText)])
		if t.keys != nil {
			select {
			case t.keys <- time.Now():
			default:
				return errors.New("typist: key times are not being consumed")
			}
		}
		// The end of the window must not cut a Step short: a key whose time
		// was published is always injected.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		r, err := t.s.Step(sctx, []*aciv1.Action{aci.Type(ch)}, nil)
		cancel()
		if err != nil {
			return err
		}
		if err := stepErr(r, 1); err != nil {
			return err
		}
	}
}

// requireScreencast skips unless guestd advertises the screencast
// capability.
func requireScreencast(ctx context.Context, hg *hostGuest) error {
	if !hg.Session.HasCapability("screencast") {
		return suiteapi.Skipf("guestd does not advertise the \"screencast\" capability (welcome capabilities: %v)", hg.Session.Welcome().GetCapabilities())
	}
	return nil
}

// startX11vnc serves dt's display on a free loopback port with Debian's
// x11vnc (binary bin) defaults (its own screen polling, XDAMAGE hints,
// -defer/-wait) plus extra arguments.
func startX11vnc(ctx context.Context, dt *harness.Desktop, bin string, extra ...string) (*desktoptest.Proc, string, error) {
	port, err := harness.FreePort()
	if err != nil {
		return nil, "", err
	}
	argv := append([]string{bin, "-display", dt.Name(), "-rfbport", strconv.Itoa(port), "-localhost",
		"-nopw", "-forever", "-shared", "-quiet"}, extra...)
	p, err := dt.Spawn("x11vnc", argv...)
	if err != nil {
		return nil, "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p, addr, nil
		}
		if exited, _ := p.Exited(); exited || time.Now().After(deadline) {
			p.Stop()
			return nil, "", fmt.Errorf("x11vnc did not listen on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// update is one streamed update as the benchmark accounts it, for either
// system.
type update struct {
	first   time.Time // the first byte arrived
	wire    int64     // bytes on the wire, framing included
	payload int64     // encoded pixel bytes (tile data and zlib chunk; RFB: rect data, see rfb.Update.Payload)
	content bool      // carries pixels (tiles, rectangles)
	key     bool      // a keyframe / full frame
	zlib    bool
}

// ourStream is one guestd screencast with its own session.
type ourStream struct {
	sess    *aci.Session
	rx      *rxLog
	id      uint32
	comp    *screencast.Compositor // lossless delta modes only
	updates chan update
	cancel  context.CancelFunc
	done    chan struct{}

	mu       sync.Mutex
	applyErr error
}

func startOurStream(ctx context.Context, hg *hostGuest, m castMode, fps int) (*ourStream, error) {
	rx := &rxLog{}
	caps := aci.DefaultCapabilities
	if !m.Zlib {
		caps = withoutCap(caps, screencast.CapabilityZlib)
	}
	sess, err := hg.Dial(ctx, nil, aci.WithDialer(rx.dialer()), aci.WithCapabilities(caps...), aci.WithEventBuffer(4096))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	o := &ourStream{sess: sess, rx: rx, updates: make(chan update, 1<<14), cancel: cancel, done: make(chan struct{})}
	if m.Lossless() {
		o.comp = screencast.NewCompositor(screencast.RGBA, screencast.WithKeyframeRequester(screencast.SessionKeyframes(sctx, sess)))
	}
	events := sess.Events(sctx)
	id, err := sess.ScreencastStart(ctx, &aciv1.ScreencastStartRequest{Fps: uint32(fps), Format: m.Format, Quality: m.Quality, Delta: m.Delta})
	if err != nil {
		cancel()
		sess.Close()
		return nil, fmt.Errorf("screencast start (%s, %d fps): %w", m.Name, fps, err)
	}
	o.id = id
	go o.pump(sctx, events)
	return o, nil
}

// pump turns frame events into updates, applying them to the compositor
// on the way (in order, before anything reads the update).
func (o *ourStream) pump(ctx context.Context, events <-chan *aciv1.Event) {
	defer close(o.done)
	defer close(o.updates)
	for ev := range events {
		f := ev.GetFrame()
		if f == nil || f.GetStreamId() != o.id {
			continue
		}
		wire := frameWireBytes(ev)
		u := update{first: o.rx.firstByte(wire), wire: wire, payload: framePayloadBytes(f),
			content: len(f.GetTiles()) > 0 || len(f.GetZlibChunk()) > 0, key: f.GetKeyframe(), zlib: f.GetFormat() == screencast.FormatZlib}
		if o.comp != nil {
			// Gaps are counted by the compositor (and recovered by a
			// keyframe); anything else is a broken stream.
			if err := o.comp.Apply(f); err != nil && !errors.Is(err, screencast.ErrGap) && !errors.Is(err, screencast.ErrAwaitingKeyframe) {
				o.mu.Lock()
				if o.applyErr == nil {
					o.applyErr = err
				}
				o.mu.Unlock()
			}
		}
		select {
		case o.updates <- u:
		case <-ctx.Done():
			return
		}
	}
}

func (o *ourStream) close() {
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = o.sess.ScreencastStop(sctx, o.id)
	cancel()
	o.cancel()
	o.sess.Close()
	go func() {
		for range o.updates {
		}
	}()
	<-o.done
}

// verify compares the reconstructed stream with a lossless screenshot once
// the screen is quiet. It returns the mismatching pixels and the sequence
// gaps seen (a mismatch after a gap is explained; one without is a bug).
func (o *ourStream) verify(ctx context.Context) (mismatch int64, gaps uint64, err error) {
	if o.comp == nil {
		return 0, 0, errors.New("verify: not a lossless stream")
	}
	for attempt := 0; attempt < 3; attempt++ {
		if _, err := drainQuiet(ctx, o.updates, 500*time.Millisecond, 5*time.Second, nil); err != nil {
			return 0, 0, err
		}
		shot, err := o.sess.Screenshot(ctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG})
		if err != nil {
			return 0, 0, fmt.Errorf("verify screenshot: %w", err)
		}
		// The screen moved while it was captured: settle and retry.
		if n, err := drainQuiet(ctx, o.updates, 300*time.Millisecond, 5*time.Second, nil); err != nil {
			return 0, 0, err
		} else if n > 0 {
			continue
		}
		img, err := png.Decode(bytes.NewReader(shot.GetData()))
		if err != nil {
			return 0, 0, fmt.Errorf("verify screenshot: %w", err)
		}
		o.mu.Lock()
		aerr := o.applyErr
		o.mu.Unlock()
		if aerr != nil {
			return 0, 0, fmt.Errorf("compositor: %w", aerr)
		}
		got := o.comp.Image()
		if got == nil {
			return 0, 0, errors.New("verify: the compositor never got a keyframe")
		}
		return mismatchedPixels(got, img), o.comp.Stats().Gaps, nil
	}
	return 0, 0, errors.New("verify: the screen kept changing")
}

// vncStream is an RFB client keeping one incremental update request
// outstanding at all times, as viewers do: the next request goes out as
// soon as an update has been read.
type vncStream struct {
	c       *rfb.Conn
	full    update
	updates chan update
	done    chan struct{}
	err     error
}

// startVNC connects a viewer and returns it with its first full frame,
// taken once x11vnc's copy of the screen is current. x11vnc polls the
// screen only while a client is connected, so a first client's initial
// full update can be a stale copy with the real content following as
// incremental updates. A second connection would not do either: ZRLE's
// zlib stream persists across a connection's updates, so a repeated full
// frame costs almost nothing. Hence a short-lived sync client first, kept
// until x11vnc has been quiet for 500 ms, then the measured viewer, whose
// first update is the full frame a new viewer pays.
func startVNC(ctx context.Context, addr string, encs []int32) (*vncStream, error) {
	sync, err := dialVNC(addr, encs)
	if err != nil {
		return nil, err
	}
	defer sync.close()
	if _, err := nextUpdate(ctx, sync.updates, 30*time.Second, nil); err != nil {
		return nil, sync.wrap(fmt.Errorf("sync client: %w", err))
	}
	if _, err := drainQuiet(ctx, sync.updates, 500*time.Millisecond, 10*time.Second, nil); err != nil {
		return nil, sync.wrap(fmt.Errorf("sync client: %w", err))
	}
	v, err := dialVNC(addr, encs)
	if err != nil {
		return nil, err
	}
	u, err := nextUpdate(ctx, v.updates, 30*time.Second, nil)
	if err == nil && !u.key {
		err = fmt.Errorf("the first update covers %d bytes, not the whole screen", u.wire)
	}
	if err != nil {
		v.close()
		return nil, v.wrap(fmt.Errorf("full frame: %w", err))
	}
	v.full = u
	return v, nil
}

// dialVNC connects and starts the pump, which asks for a full frame first.
func dialVNC(addr string, encs []int32) (*vncStream, error) {
	c, err := rfb.Dial(addr, 10*time.Second, encs...)
	if err != nil {
		return nil, err
	}
	v := &vncStream{c: c, updates: make(chan update, 1<<14), done: make(chan struct{})}
	go v.pump()
	return v, nil
}

// wrap adds the connection's error, if it failed, to err.
func (v *vncStream) wrap(err error) error {
	select {
	case <-v.done:
		if v.err != nil {
			return fmt.Errorf("%w (rfb: %v)", err, v.err)
		}
	default:
	}
	return err
}

func (v *vncStream) pump() {
	defer close(v.done)
	defer close(v.updates)
	screen := int64(v.c.Width) * int64(v.c.Height)
	if err := v.c.Request(false); err != nil {
		v.err = err
		return
	}
	for {
		u, err := v.c.ReadUpdate(time.Time{})
		if err != nil {
			v.err = err
			return
		}
		if err := v.c.Request(true); err != nil {
			v.err = err
			return
		}
		v.updates <- update{first: u.FirstByte, wire: u.Bytes, payload: u.Payload, content: u.Rects > 0, key: u.Pixels >= screen}
	}
}

func (v *vncStream) close() {
	v.c.Close()
	go func() {
		for range v.updates {
		}
	}()
	<-v.done
}

// drainQuiet consumes updates until none arrived for quiet, or max passed;
// fn (when set) sees each. It returns how many updates it consumed.
func drainQuiet(ctx context.Context, ch <-chan update, quiet, max time.Duration, fn func(update)) (int, error) {
	deadline := time.Now().Add(max)
	n := 0
	for {
		wait := min(quiet, time.Until(deadline))
		if wait <= 0 {
			return n, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return n, ctx.Err()
		case <-t.C:
			return n, nil
		case u, ok := <-ch:
			t.Stop()
			if !ok {
				return n, errors.New("stream ended")
			}
			n++
			if fn != nil {
				fn(u)
			}
		}
	}
}

// nextUpdate waits for the next update carrying pixels.
func nextUpdate(ctx context.Context, ch <-chan update, timeout time.Duration, fn func(update)) (update, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return update{}, ctx.Err()
		case <-t.C:
			return update{}, fmt.Errorf("no update within %s", timeout)
		case u, ok := <-ch:
			if !ok {
				return update{}, errors.New("stream ended")
			}
			if fn != nil {
				fn(u)
			}
			if u.content {
				return u, nil
			}
		}
	}
}

// cell accumulates one (system, mode, content, fps) cell's rows.
type cell struct {
	lbl      map[string]string
	baseline bool
	rows     []result.Row
}

func (c *cell) series(metric, unit string) *result.Series {
	s := result.NewSeries(metric, unit, c.lbl)
	s.Baseline = c.baseline
	return s
}

func (c *cell) single(metric, unit string, v float64, better string) {
	r := result.Single(metric, unit, c.lbl, v)
	r.Baseline, r.Better = c.baseline, better
	c.rows = append(c.rows, r)
}

// typingStats is what a typing window measured.
type typingStats struct {
	frames     int
	wireSum    int64
	payloadSum int64
	zlibFrames int
	elapsed    time.Duration
}

// typeAndMeasure types 12 chars/s for window through its own session while
// consuming ch, then waits for the stream to go quiet; per-update bytes
// (wire, payload and the framing between them) and key-to-update latencies
// go into c.
func typeAndMeasure(ctx context.Context, hg *hostGuest, ch <-chan update, window time.Duration, c *cell) (typingStats, error) {
	var st typingStats
	wire := c.series("screencast.update_wire_bytes", "bytes")
	payload := c.series("screencast.update_payload_bytes", "bytes")
	overhead := c.series("screencast.update_overhead_bytes", "bytes")
	lat := c.series("screencast.key_to_update", "ms")
	tsess, err := hg.Dial(ctx, nil)
	if err != nil {
		return st, err
	}
	defer tsess.Close()
	keys := make(chan time.Time, 4096)
	var pairer keyPairer
	ty := &typist{s: tsess, keys: keys}
	tctx, tcancel := context.WithTimeout(ctx, window)
	defer tcancel()
	tdone := make(chan error, 1)
	go func() { tdone <- ty.run(tctx) }()
	handle := func(u update) {
		st.wireSum += u.wire
		st.payloadSum += u.payload
		if !u.content {
			return
		}
		for drained := false; !drained; {
			select {
			case k := <-keys:
				pairer.key(k)
			default:
				drained = true
			}
		}
		if d, ok := pairer.update(u.first); ok {
			lat.Add(suiteapi.Ms(d))
		}
		st.frames++
		if u.zlib {
			st.zlibFrames++
		}
		wire.Add(float64(u.wire))
		payload.Add(float64(u.payload))
		overhead.Add(float64(u.wire - u.payload))
	}
	t0 := time.Now()
	var tErr error
	typing := true
	for typing {
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case tErr = <-tdone:
			typing = false
		case u, ok := <-ch:
			if !ok {
				tcancel()
				<-tdone
				return st, errors.New("stream ended while typing")
			}
			handle(u)
		}
	}
	if tErr != nil {
		return st, fmt.Errorf("typing: %w", tErr)
	}
	// The last keys' updates: wait until the stream is quiet.
	if _, err := drainQuiet(ctx, ch, 500*time.Millisecond, 10*time.Second, handle); err != nil {
		return st, err
	}
	for drained := false; !drained; {
		select {
		case k := <-keys:
			pairer.key(k)
		default:
			drained = true
		}
	}
	// A key no update followed is a failed sample, not a silent one.
	for i := 0; i < pairer.unanswered(); i++ {
		lat.Fail()
	}
	st.elapsed = time.Since(t0)
	c.rows = append(c.rows, wire.Row(), payload.Row(), overhead.Row(), lat.Row())
	c.single("screencast.frames", "frames", float64(st.frames), "")
	c.single("screencast.typing_wire_rate", "bytes/s", float64(st.wireSum)/st.elapsed.Seconds(), result.BetterLower)
	if st.payloadSum > 0 {
		c.single("screencast.wire_payload_ratio", "x", float64(st.wireSum)/float64(st.payloadSum), result.BetterLower)
	}
	return st, nil
}

type screencastSuite struct {
	window     time.Duration
	idle       time.Duration
	fpsSet     intList
	latencyFPS intList
	modes      modeList
	scrolls    int
}

func (*screencastSuite) Name() string { return "screencast" }
func (*screencastSuite) Description() string {
	return "screencast modes (full/delta PNG, JPEG q80, delta-zlib) at 5/10/30 fps while typing 12 chars/s on sparse and dense screens: payload and wire bytes per frame, key-to-first-update, idle, terminal scroll, pixel-exact reconstruction; vs x11vnc over RFB (ZRLE/Tight/Raw) in the same run"
}

func (s *screencastSuite) Flags(fs *flag.FlagSet) {
	s.fpsSet = intList{5, 10, 30}
	s.latencyFPS = intList{60}
	s.modes = append(modeList(nil), castModes...)
	fs.DurationVar(&s.window, "screencast-window", 10*time.Second, "typing window per cell")
	fs.DurationVar(&s.idle, "screencast-idle", 3*time.Second, "quiet window after a stream starts")
	fs.Var(&s.fpsSet, "screencast-fps", "frame-rate caps every mode is measured at")
	fs.Var(&s.latencyFPS, "screencast-latency-fps", "extra frame-rate caps for delta-zlib (the default lossless delta)")
	fs.Var(&s.modes, "screencast-modes", "modes to measure (full-png, full-jpeg-q80, delta-png, delta-zlib, delta-jpeg-q80)")
	fs.IntVar(&s.scrolls, "screencast-scrolls", 5, "one-line terminal scrolls measured per system")
}

// Peers: x11vnc, the VNC server a user would run to watch the desktop.
func (s *screencastSuite) Peers() []string { return []string{"x11vnc"} }

func (s *screencastSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	if s.window < time.Second || s.idle < time.Second || s.scrolls < 1 {
		return fmt.Errorf("screencast: --screencast-window and --screencast-idle must be >= 1s, --screencast-scrolls >= 1")
	}
	for _, f := range append(append(intList(nil), s.fpsSet...), s.latencyFPS...) {
		if f < 1 || f > 60 {
			return fmt.Errorf("screencast: fps %d outside 1..60", f)
		}
	}
	return checkHostGuest(env)
}

// reconstructionFailure collects lossless streams that did not reconstruct
// pixel-exactly without a sequence gap to explain it.
type reconstructionFailure []string

func (s *screencastSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	hg, err := startHostGuest(ctx, env)
	if err != nil {
		return nil, err
	}
	defer hg.Stop()
	if err := requireScreencast(ctx, hg); err != nil {
		return nil, err
	}
	if !hg.Session.HasCapability(screencast.CapabilityZlib) {
		env.Notef("guestd does not advertise %q: delta-zlib cells stream PNG tiles", screencast.CapabilityZlib)
	}
	x11vnc, haveX11vnc := env.Peer("x11vnc")
	var rows []result.Row
	var bad reconstructionFailure
	zlib, _ := castModeNamed("delta-zlib")
	for _, sc := range []harness.Scene{harness.SceneSparse, harness.SceneDense} {
		for _, m := range s.modes {
			fpsList := append(intList(nil), s.fpsSet...)
			if m.Name == zlib.Name {
				for _, f := range s.latencyFPS {
					if !slices.Contains(fpsList, f) {
						fpsList = append(fpsList, f)
					}
				}
			}
			for _, fps := range fpsList {
				r, err := s.ours(ctx, env, hg, sc, m, fps, &bad)
				rows = append(rows, r...)
				if err != nil {
					return rows, fmt.Errorf("%s %s %d fps: %w", m.Name, sc, fps, err)
				}
			}
		}
	}
	for _, name := range []string{"delta-zlib", "delta-png"} {
		m, _ := castModeNamed(name)
		r, err := s.scrollOurs(ctx, env, hg, m, &bad)
		rows = append(rows, r...)
		if err != nil {
			return rows, fmt.Errorf("scroll %s: %w", name, err)
		}
	}
	if haveX11vnc {
		r, err := s.peers(ctx, env, hg, x11vnc)
		rows = append(rows, r...)
		if err != nil {
			return rows, fmt.Errorf("x11vnc: %w", err)
		}
	}
	env.Notef("key_to_update: from the moment a key's Step is sent (the typist injects through guestd for both systems) to the first byte of the first update that began arriving after it; x11vnc's client keeps one incremental request outstanding at all times")
	env.Notef("update_wire_bytes: forkfleet = the WebSocket message (protobuf envelope) plus its frame header; x11vnc = the whole FramebufferUpdate message. update_payload_bytes = the encoded pixels: forkfleet's tile data and zlib chunk, x11vnc's rectangle data (less the message and rectangle headers and ZRLE's length prefix). update_overhead_bytes = wire - payload per update")
	env.Notef("wire/payload: full_frame_wire_payload_ratio is the framing cost on a full frame, where a ratio target (<= 1.01) is meaningful. On a typing update the framing is a fixed number of bytes (forkfleet: the 2 B WebSocket header plus the protobuf envelope: ServerMessage/Event tags and lengths, stream id, seq, format, time delta, chunk length; RFB ZRLE: 4 B message header + 12 B rectangle header + 4 B length = 20 B) on a payload of 10 to 30 B, so wire_payload_ratio over a typing window is 1.5 to 3 for both systems and cannot approach 1.01: the 2-byte WebSocket header alone is 13%% of a 15-byte payload. There the figures to compare are update_overhead_bytes and update_wire_bytes")
	if len(bad) > 0 {
		return rows, fmt.Errorf("lossless stream did not reconstruct pixel-exactly without a sequence gap: %v", []string(bad))
	}
	return rows, nil
}

func (s *screencastSuite) span(ctx context.Context, env *suiteapi.Env, name string, kv ...attribute.KeyValue) (context.Context, oteltrace.Span) {
	return env.Tracer.Start(ctx, name, oteltrace.WithAttributes(kv...))
}

// ours measures one cell of guestd's screencast on a freshly painted scene:
// the keyframe, the idle window, a typing window, and (lossless delta) the
// reconstruction.
func (s *screencastSuite) ours(ctx context.Context, env *suiteapi.Env, hg *hostGuest, sc harness.Scene, m castMode, fps int, bad *reconstructionFailure) ([]result.Row, error) {
	ctx, span := s.span(ctx, env, "screencast.cell", attribute.String("system", "forkfleet"), attribute.String("mode", m.Name),
		attribute.String("content", string(sc)), attribute.Int("fps", fps))
	defer span.End()
	if err := freshScene(ctx, env, hg, sc); err != nil {
		return nil, err
	}
	c := &cell{lbl: labels("system", "forkfleet", "mode", m.Name, "content", string(sc), "fps", itoa(fps))}
	t0 := time.Now()
	o, err := startOurStream(ctx, hg, m, fps)
	if err != nil {
		return nil, err
	}
	defer o.close()
	first, err := nextUpdate(ctx, o.updates, 10*time.Second, nil)
	if err != nil {
		return nil, fmt.Errorf("keyframe: %w", err)
	}
	if !first.key {
		return nil, errors.New("the first frame is not a keyframe")
	}
	c.single("screencast.full_frame_wire_bytes", "bytes", float64(first.wire), "")
	c.single("screencast.full_frame_payload_bytes", "bytes", float64(first.payload), "")
	c.single("screencast.full_frame_wire_payload_ratio", "x", float64(first.wire)/float64(max(first.payload, 1)), result.BetterLower)
	idleFrames, idleBytes := 1, int64(0)
	if _, err := drainQuiet(ctx, o.updates, s.idle, time.Until(t0.Add(s.idle)), func(u update) {
		idleBytes += u.wire
		if u.content {
			idleFrames++
		}
	}); err != nil {
		return nil, err
	}
	c.single("screencast.idle_frames_3s", "frames", float64(idleFrames), "")
	c.single("screencast.idle_bytes_3s", "bytes", float64(idleBytes), "")
	rx0 := o.rx.Rx()
	st, err := typeAndMeasure(ctx, hg, o.updates, s.window, c)
	if err != nil {
		return c.rows, err
	}
	// Cross-check the per-message accounting against the socket: in the
	// typing window this session received frames and nothing else.
	if tcp := o.rx.Rx() - rx0; tcp > 0 && absf(float64(tcp-st.wireSum))/float64(tcp) > 0.01 {
		env.Notef("%s: frames account for %d wire bytes, the socket received %d", labelString(c.lbl), st.wireSum, tcp)
	}
	if m.Zlib && st.frames > 0 && st.zlibFrames == 0 {
		env.Notef("%s: no frame used IMAGE_FORMAT_ZLIB_RECORDS", labelString(c.lbl))
	}
	if !m.Zlib && st.zlibFrames > 0 {
		return c.rows, fmt.Errorf("%d zlib frames on a session that did not offer %q", st.zlibFrames, screencast.CapabilityZlib)
	}
	env.Progressf("screencast: %s: %d frames, wire p50 %s B, key-to-update p50 %s ms", labelString(c.lbl), st.frames,
		rowP50(c.rows, "screencast.update_wire_bytes"), rowP50(c.rows, "screencast.key_to_update"))
	if m.Lossless() {
		if err := s.reconstruction(ctx, env, o, c, bad); err != nil {
			return c.rows, err
		}
	}
	return c.rows, nil
}

// reconstruction records the lossless check of a cell.
func (s *screencastSuite) reconstruction(ctx context.Context, env *suiteapi.Env, o *ourStream, c *cell, bad *reconstructionFailure) error {
	mismatch, gaps, err := o.verify(ctx)
	if err != nil {
		return err
	}
	c.single("screencast.reconstruction_mismatch_pixels", "pixels", float64(mismatch), "")
	c.single("screencast.reconstruction_seq_gaps", "gaps", float64(gaps), "")
	if mismatch > 0 && gaps == 0 {
		*bad = append(*bad, fmt.Sprintf("%s: %d pixels", labelString(c.lbl), mismatch))
	}
	if mismatch > 0 {
		env.Notef("%s: reconstruction differs from the screenshot in %d pixels (%d sequence gaps)", labelString(c.lbl), mismatch, gaps)
	}
	return nil
}

// freshScene repaints sc with a new xterm, so every cell starts from the
// same screen (typing in earlier cells would otherwise fill and scroll it),
// waits until the window manager has focused it (typing goes there, and
// focus redraws its cursor) and until the screen has been quiet for 500 ms.
func freshScene(ctx context.Context, env *suiteapi.Env, hg *hostGuest, sc harness.Scene) error {
	if err := hg.Desktop.SetScene(ctx, sc, env.WorkDir); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for focused := false; !focused; {
		wins, err := hg.Session.ListWindows(ctx)
		if err != nil {
			return fmt.Errorf("list windows: %w", err)
		}
		for _, w := range wins {
			focused = focused || (w.GetFocused() && w.GetClass() == "XTerm")
		}
		if focused {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("scene %s: no focused xterm within 10s", sc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Drawn means two settled captures agree: on a loaded host a paint can
	// stall past the settle window, and what it drew late would land in the
	// idle window as a frame. guestd answers the second capture from its
	// cache when nothing was drawn, so a still scene costs nothing more.
	var drawn []byte
	for deadline := time.Now().Add(20 * time.Second); ; {
		r, err := hg.Session.Screenshot(ctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE,
			SettleMs: 500, SettleTimeoutMs: 5000, IfNoneMatch: drawn})
		if err != nil {
			return err
		}
		if r.GetNotModified() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("scene %s: still changing after 20s", sc)
		}
		drawn = r.GetFrameHash()
	}
}

// x11vncLowLatency are the x11vnc options that minimize its own pacing
// (screen poll pause and update deferral, default 20 ms each): the best
// latency a tuned x11vnc reaches, next to Debian's defaults.
var x11vncLowLatency = []string{"-defer", "1", "-wait", "1", "-nonap"}

// peers measures x11vnc with each encoding on both scenes, the ZRLE cells
// again with x11vnc tuned for latency, then the scroll.
func (s *screencastSuite) peers(ctx context.Context, env *suiteapi.Env, hg *hostGuest, x11vnc string) ([]result.Row, error) {
	var rows []result.Row
	for _, tuning := range []string{"defaults", "low-latency"} {
		var extra []string
		encs := rfbEncodings
		if tuning == "low-latency" {
			extra, encs = x11vncLowLatency, rfbEncodings[:1]
		}
		p, addr, err := startX11vnc(ctx, hg.Desktop, x11vnc, extra...)
		if err != nil {
			return rows, err
		}
		for _, sc := range []harness.Scene{harness.SceneSparse, harness.SceneDense} {
			for _, enc := range encs {
				r, err := s.peer(ctx, env, hg, addr, sc, enc.name, enc.list, tuning)
				rows = append(rows, r...)
				if err != nil {
					p.Stop()
					return rows, fmt.Errorf("%s %s (%s): %w", enc.name, sc, tuning, err)
				}
			}
		}
		if tuning == "defaults" {
			for _, enc := range rfbEncodings[:2] {
				r, err := s.scrollPeer(ctx, env, hg, addr, enc.name, enc.list)
				rows = append(rows, r...)
				if err != nil {
					p.Stop()
					return rows, fmt.Errorf("scroll %s: %w", enc.name, err)
				}
			}
		}
		p.Stop()
	}
	env.Notef("x11vnc tuning=low-latency runs with %v (Debian defaults: 20 ms screen-poll pause and 20 ms update deferral)", x11vncLowLatency)
	return rows, nil
}

// rfbEncodings are the client's preference lists; like real viewers the
// lossless ones offer CopyRect, which x11vnc may use for scrolls.
var rfbEncodings = []struct {
	name string
	list []int32
}{
	{"rfb-zrle", []int32{rfb.EncZRLE, rfb.EncCopyRect, rfb.EncTight, rfb.EncRaw}},
	{"rfb-tight", []int32{rfb.EncTight, rfb.EncCopyRect, rfb.EncZRLE, rfb.EncRaw}},
	{"rfb-raw", []int32{rfb.EncRaw}},
}

func (s *screencastSuite) peer(ctx context.Context, env *suiteapi.Env, hg *hostGuest, addr string, sc harness.Scene, encName string, encs []int32, tuning string) ([]result.Row, error) {
	ctx, span := s.span(ctx, env, "screencast.cell", attribute.String("system", "x11vnc"), attribute.String("mode", encName),
		attribute.String("content", string(sc)), attribute.String("tuning", tuning))
	defer span.End()
	if err := freshScene(ctx, env, hg, sc); err != nil {
		return nil, err
	}
	c := &cell{lbl: labels("system", "x11vnc", "mode", encName, "content", string(sc), "requests", "outstanding", "tuning", tuning), baseline: true}
	v, err := startVNC(ctx, addr, encs)
	if err != nil {
		return nil, err
	}
	defer v.close()
	// The idle window starts at the (synchronized) full frame.
	t0 := v.full.first
	c.single("screencast.full_frame_wire_bytes", "bytes", float64(v.full.wire), "")
	c.single("screencast.full_frame_payload_bytes", "bytes", float64(v.full.payload), "")
	c.single("screencast.full_frame_wire_payload_ratio", "x", float64(v.full.wire)/float64(max(v.full.payload, 1)), result.BetterLower)
	idleFrames, idleBytes := 1, int64(0)
	if _, err := drainQuiet(ctx, v.updates, s.idle, time.Until(t0.Add(s.idle)), func(u update) {
		idleBytes += u.wire
		if u.content {
			idleFrames++
		}
	}); err != nil {
		return nil, fmt.Errorf("idle: %w (%v)", err, v.err)
	}
	c.single("screencast.idle_frames_3s", "frames", float64(idleFrames), "")
	c.single("screencast.idle_bytes_3s", "bytes", float64(idleBytes), "")
	st, err := typeAndMeasure(ctx, hg, v.updates, s.window, c)
	if err != nil {
		if v.err != nil {
			err = fmt.Errorf("%w (rfb: %v)", err, v.err)
		}
		return c.rows, err
	}
	env.Progressf("screencast: %s: %d updates, wire p50 %s B, key-to-update p50 %s ms", labelString(c.lbl), st.frames,
		rowP50(c.rows, "screencast.update_wire_bytes"), rowP50(c.rows, "screencast.key_to_update"))
	return c.rows, nil
}

// scrollTerm is a full-screen xterm of dense colored text that prints one
// more line each time a trigger file appears, scrolling by exactly one
// line: the terminal-scroll workload.
type scrollTerm struct {
	proc *desktoptest.Proc
	dir  string
	next int
}

func startScrollTerm(ctx context.Context, env *suiteapi.Env, hg *hostGuest, n int) (*scrollTerm, error) {
	if err := freshScene(ctx, env, hg, harness.SceneSparse); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(env.WorkDir, "scroll-")
	if err != nil {
		return nil, err
	}
	text := filepath.Join(dir, "text")
	if err := os.WriteFile(text, []byte(harness.DenseText(200, 60)), 0o644); err != nil {
		return nil, err
	}
	script := fmt.Sprintf(`cat %s; i=1; while [ $i -le %d ]; do while [ ! -e %s/go$i ]; do sleep 0.02; done; printf 'seq %%d\n' $i; i=$((i+1)); done; exec sleep 2147483647`,
		shellQuoteArg(text), n, shellQuoteArg(dir))
	p, err := hg.Desktop.Spawn("xterm-scroll", "xterm", "-fn", "fixed", "+sb", "-bg", "black", "-fg", "grey85",
		"-geometry", "208x58+0+0", "-e", "sh", "-c", script)
	if err != nil {
		return nil, err
	}
	st := &scrollTerm{proc: p, dir: dir, next: 1}
	// Painted and quiet: the text fills the window and nothing moves.
	deadline := time.Now().Add(15 * time.Second)
	for {
		shot, err := hg.Session.Screenshot(ctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, SettleMs: 500, SettleTimeoutMs: 3000})
		if err != nil {
			p.Stop()
			return nil, err
		}
		if len(shot.GetData()) > 50_000 { // the sparse scene is ~20 KB, dense text hundreds of KB
			return st, nil
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, errors.New("the scroll xterm did not paint its text within 15s")
		}
	}
}

// scroll makes the terminal print one line.
func (t *scrollTerm) scroll() error {
	f := filepath.Join(t.dir, "go"+strconv.Itoa(t.next))
	t.next++
	return os.WriteFile(f, nil, 0o644)
}

func (t *scrollTerm) stop() { t.proc.Stop() }

func shellQuoteArg(s string) string {
	out := "'"
	for _, r := range s {
		if r == '\'' {
			out += `'\''`
			continue
		}
		out += string(r)
	}
	return out + "'"
}

// measureScrolls triggers n one-line scrolls and records the bytes each
// cost (every update until the stream is quiet again) against the full
// frame of the same screen.
func measureScrolls(ctx context.Context, term *scrollTerm, ch <-chan update, n int, full int64, c *cell) error {
	wire := c.series("screencast.scroll_wire_bytes", "bytes")
	ups := c.series("screencast.scroll_updates", "updates")
	if _, err := drainQuiet(ctx, ch, 500*time.Millisecond, 5*time.Second, nil); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if err := term.scroll(); err != nil {
			return err
		}
		var cost int64
		count := 0
		add := func(u update) {
			cost += u.wire
			if u.content {
				count++
			}
		}
		if _, err := nextUpdate(ctx, ch, 5*time.Second, add); err != nil {
			return fmt.Errorf("scroll %d: %w", i+1, err)
		}
		if _, err := drainQuiet(ctx, ch, 300*time.Millisecond, 5*time.Second, add); err != nil {
			return err
		}
		wire.Add(float64(cost))
		ups.Add(float64(count))
	}
	c.single("screencast.full_frame_wire_bytes", "bytes", float64(full), "")
	c.rows = append(c.rows, wire.Row(), ups.Row())
	c.single("screencast.scroll_vs_full", "x", median(wire.Values())/float64(full), result.BetterLower)
	return nil
}

func (s *screencastSuite) scrollOurs(ctx context.Context, env *suiteapi.Env, hg *hostGuest, m castMode, bad *reconstructionFailure) ([]result.Row, error) {
	const fps = 30
	ctx, span := s.span(ctx, env, "screencast.scroll", attribute.String("system", "forkfleet"), attribute.String("mode", m.Name))
	defer span.End()
	term, err := startScrollTerm(ctx, env, hg, s.scrolls)
	if err != nil {
		return nil, err
	}
	defer term.stop()
	c := &cell{lbl: labels("system", "forkfleet", "mode", m.Name, "content", "scroll", "fps", itoa(fps))}
	o, err := startOurStream(ctx, hg, m, fps)
	if err != nil {
		return nil, err
	}
	defer o.close()
	first, err := nextUpdate(ctx, o.updates, 10*time.Second, nil)
	if err != nil {
		return nil, fmt.Errorf("keyframe: %w", err)
	}
	if err := measureScrolls(ctx, term, o.updates, s.scrolls, first.wire, c); err != nil {
		return c.rows, err
	}
	env.Progressf("screencast: scroll %s: p50 %s B per one-line scroll, full frame %d B", m.Name, rowP50(c.rows, "screencast.scroll_wire_bytes"), first.wire)
	if m.Lossless() {
		if err := s.reconstruction(ctx, env, o, c, bad); err != nil {
			return c.rows, err
		}
	}
	return c.rows, nil
}

func (s *screencastSuite) scrollPeer(ctx context.Context, env *suiteapi.Env, hg *hostGuest, addr, encName string, encs []int32) ([]result.Row, error) {
	ctx, span := s.span(ctx, env, "screencast.scroll", attribute.String("system", "x11vnc"), attribute.String("mode", encName))
	defer span.End()
	term, err := startScrollTerm(ctx, env, hg, s.scrolls)
	if err != nil {
		return nil, err
	}
	defer term.stop()
	c := &cell{lbl: labels("system", "x11vnc", "mode", encName, "content", "scroll", "requests", "outstanding", "tuning", "defaults"), baseline: true}
	v, err := startVNC(ctx, addr, encs)
	if err != nil {
		return nil, err
	}
	defer v.close()
	if err := measureScrolls(ctx, term, v.updates, s.scrolls, v.full.wire, c); err != nil {
		return c.rows, err
	}
	env.Progressf("screencast: scroll x11vnc %s: p50 %s B per one-line scroll, full frame %d B", encName, rowP50(c.rows, "screencast.scroll_wire_bytes"), v.full.wire)
	return c.rows, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func absf(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// rowP50 formats the p50 of the row named metric for progress lines.
func rowP50(rows []result.Row, metric string) string {
	for i := len(rows) - 1; i >= 0; i-- {
		if rows[i].Metric == metric && rows[i].P50 != nil {
			return strconv.FormatFloat(*rows[i].P50, 'f', 1, 64)
		}
	}
	return "-"
}

func labelString(l map[string]string) string {
	r := result.Row{Labels: l}
	return strings.TrimSpace(r.Key())
}

// The pure parts of the measurements (wire accounting, first-byte dating,
// key/update pairing, pixel comparison) follow; they are unit-tested
// without a display.

// wsHeaderLen is the size of an unmasked (server to client) WebSocket frame
// header for a payload of n bytes (RFC 6455 5.2).
func wsHeaderLen(n int) int {
	switch {
	case n < 126:
		return 2
	case n < 1<<16:
		return 4
	}
	return 10
}

// frameWireBytes is what the event cost on the wire: the protobuf envelope
// guestd sent (a ServerMessage holding the event) plus its WebSocket frame
// header. guestd writes every envelope as one unfragmented binary message
// without compression (docs/aci-spec.md section 1).
func frameWireBytes(ev *aciv1.Event) int64 {
	n := proto.Size(&aciv1.ServerMessage{Reply: &aciv1.ServerMessage_Event{Event: ev}})
	return int64(n + wsHeaderLen(n))
}

// framePayloadBytes is the frame's encoded pixel data: its tiles' data and
// its zlib chunk.
func framePayloadBytes(f *aciv1.ScreencastFrame) int64 {
	n := int64(len(f.GetZlibChunk()))
	for _, t := range f.GetTiles() {
		n += int64(len(t.GetData()))
	}
	return n
}

// rxLog counts a connection's bytes and remembers when each read returned
// data, so the first byte of a message can be dated after the WebSocket
// library has parsed it.
type rxLog struct {
	mu    sync.Mutex
	rx    int64
	tx    int64
	reads []rxRead
}

type rxRead struct {
	at  time.Time
	end int64 // cumulative bytes received once this read returned
}

// rxLogKeep bounds the read log: older reads are forgotten in bulk.
const rxLogKeep = 4096

func (l *rxLog) read(n int, at time.Time) {
	if n <= 0 {
		return
	}
	l.mu.Lock()
	l.rx += int64(n)
	l.reads = append(l.reads, rxRead{at: at, end: l.rx})
	if len(l.reads) >= 2*rxLogKeep {
		l.reads = append(l.reads[:0], l.reads[len(l.reads)-rxLogKeep:]...)
	}
	l.mu.Unlock()
}

func (l *rxLog) wrote(n int) {
	l.mu.Lock()
	l.tx += int64(n)
	l.mu.Unlock()
}

// Rx is the number of bytes received so far.
func (l *rxLog) Rx() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rx
}

// firstByte dates the first byte of a message of size bytes that has just
// been parsed, assuming it is the last message received so far. When more
// bytes were already read behind it, the date is later than the truth:
// latencies derived from it can only err high, never flatter.
func (l *rxLog) firstByte(size int64) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.reads) == 0 {
		return time.Now()
	}
	start := l.rx - size
	i := sort.Search(len(l.reads), func(i int) bool { return l.reads[i].end > start })
	if i == len(l.reads) {
		i = len(l.reads) - 1
	}
	return l.reads[i].at
}

// dialer returns an aci dial function whose connections report to l.
func (l *rxLog) dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		return &rxConn{Conn: c, log: l}, nil
	}
}

type rxConn struct {
	net.Conn
	log *rxLog
}

func (c *rxConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.log.read(n, time.Now())
	return n, err
}

func (c *rxConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.log.wrote(n)
	return n, err
}

// keyPairer pairs injected keys with the first streamed update that
// arrived after them: a key's latency is from its injection to the first
// byte of the first update with content that began arriving after it.
// Keys that one update covers together yield one sample, the oldest's.
type keyPairer struct {
	pending []time.Time
}

// key records a key injected at t (keys come in injection order).
func (p *keyPairer) key(t time.Time) { p.pending = append(p.pending, t) }

// update pairs an update whose first byte arrived at first; it returns the
// latency of the oldest key injected before it and whether there was one.
func (p *keyPairer) update(first time.Time) (time.Duration, bool) {
	n := 0
	for n < len(p.pending) && !p.pending[n].After(first) {
		n++
	}
	if n == 0 {
		return 0, false
	}
	d := first.Sub(p.pending[0])
	p.pending = p.pending[n:]
	return d, true
}

// unanswered is the number of keys no update has followed yet.
func (p *keyPairer) unanswered() int { return len(p.pending) }

// mismatchedPixels counts the pixels whose RGB differs between a and b; a
// size difference counts every pixel of the larger one.
func mismatchedPixels(a, b image.Image) int64 {
	ra, rb := toRGBA(a), toRGBA(b)
	if ra.Rect.Size() != rb.Rect.Size() {
		s := ra.Rect.Size()
		if t := rb.Rect.Size(); t.X*t.Y > s.X*s.Y {
			s = t
		}
		return int64(s.X * s.Y)
	}
	var n int64
	w, h := ra.Rect.Dx(), ra.Rect.Dy()
	for y := 0; y < h; y++ {
		pa := ra.Pix[ra.PixOffset(ra.Rect.Min.X, ra.Rect.Min.Y+y):][:4*w]
		pb := rb.Pix[rb.PixOffset(rb.Rect.Min.X, rb.Rect.Min.Y+y):][:4*w]
		for x := 0; x < 4*w; x += 4 {
			if pa[x] != pb[x] || pa[x+1] != pb[x+1] || pa[x+2] != pb[x+2] {
				n++
			}
		}
	}
	return n
}

func toRGBA(img image.Image) *image.RGBA {
	if r, ok := img.(*image.RGBA); ok {
		return r
	}
	r := image.NewRGBA(img.Bounds())
	draw.Draw(r, r.Rect, img, img.Bounds().Min, draw.Src)
	return r
}

// castMode is one way of streaming the screen.
type castMode struct {
	Name    string
	Format  aciv1.ImageFormat
	Quality uint32
	Delta   bool
	// Zlib offers the "screencast.zlib" capability: lossless delta frames
	// then travel as IMAGE_FORMAT_ZLIB_RECORDS frames.
	Zlib bool
}

// Lossless reports whether the stream reconstructs pixel-exactly.
func (m castMode) Lossless() bool { return m.Delta && m.Format == aciv1.ImageFormat_IMAGE_FORMAT_PNG }

var castModes = []castMode{
	{Name: "full-png", Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG},
	{Name: "full-jpeg-q80", Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: 80},
	{Name: "delta-png", Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Delta: true},
	{Name: "delta-zlib", Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Delta: true, Zlib: true},
	{Name: "delta-jpeg-q80", Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: 80, Delta: true},
}

func castModeNamed(name string) (castMode, bool) {
	for _, m := range castModes {
		if m.Name == name {
			return m, true
		}
	}
	return castMode{}, false
}

// modeList is a comma-separated list flag of screencast mode names.
type modeList []castMode

func (l *modeList) String() string {
	names := make([]string, len(*l))
	for i, m := range *l {
		names[i] = m.Name
	}
	return strings.Join(names, ",")
}

func (l *modeList) Set(s string) error {
	var out []castMode
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		m, ok := castModeNamed(p)
		if !ok {
			var known []string
			for _, k := range castModes {
				known = append(known, k.Name)
			}
			return fmt.Errorf("unknown screencast mode %q (known: %s)", p, strings.Join(known, ", "))
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return fmt.Errorf("empty list")
	}
	*l = out
	return nil
}

// withoutCap returns caps without name.
func withoutCap(caps []string, name string) []string {
	out := make([]string, 0, len(caps))
	for _, c := range caps {
		if c != name {
			out = append(out, c)
		}
	}
	return out
}
