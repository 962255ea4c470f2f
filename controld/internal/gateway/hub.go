package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"net"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/api/screencast"
	"github.com/forkfleet/forkfleet/controld/internal/recording"
)

// A hub is the one screencast subscription of a sandbox that all its
// viewers share (view.go). It holds an ACI session to the sandbox's guestd,
// applies every frame to a screencast.Compositor first (the frames come
// from the sandbox: the compositor's size and bounds checks decide what
// reaches a browser, and a gap or a corrupt frame asks for a keyframe),
// then fans the frame out to the viewers as a compact binary message (the
// format is in view.js).
//
// A viewer never slows the capture: each has a queue bounded in bytes; one
// that overflows it loses its queue and resyncs from the hub's history, the
// last keyframe and the frames since (their DEFLATE context restarts at the
// keyframe, so that replays exactly), without asking the guest for
// anything. The history is bounded too; past it the hub asks guestd for a
// keyframe once.

const (
	// viewReadLimit bounds one message from guestd (a keyframe PNG).
	viewReadLimit = 32 << 20
	// maxHistory bounds the keyframe and deltas kept for late viewers.
	maxHistory = 8 << 20
	// maxPending bounds what one viewer has queued.
	maxPending = 4 << 20
	// viewFPS caps the shared stream's rate; capture is damage-gated, so a
	// quiet screen costs nothing at any cap.
	viewFPS = 60
)

// Browser message kinds (view.js parses them).
const (
	msgFrame  = 1
	msgCursor = 2
	msgHello  = 3
)

type viewer struct {
	wake    chan struct{} // cap 1
	pending [][]byte
	bytes   int
	resync  bool // take the history instead of pending
	dropped uint64
}

type hub struct {
	g      *Gateway
	id     string
	ctx    context.Context // the hub's life (run's)
	cancel context.CancelFunc
	done   chan struct{}
	// gone is closed when the sandbox no longer exists (deleted): its
	// viewers are told (4404) instead of waiting for it.
	gone chan struct{}

	mu      sync.Mutex
	viewers map[*viewer]struct{}
	// sinks are the sandbox's recordings (package recording): consumers
	// of the same frames, after the same compositor, that never block.
	sinks map[recording.Sink]struct{}
	// hashes: the current stream carries frame_hash on every frame (while
	// recording: the trajectory names frames by guestd's hash); set when
	// the session decides it, before the stream starts.
	hashes   bool
	history  [][]byte // a keyframe, then the frames since; nil when not synced
	histSize int
	synced   bool
	cursor   []byte // the last cursor message
	sess     *aci.Session
	stream   uint32
	// conn is the upstream connection from its dial on (sess only exists
	// once the stream started): what drop closes.
	conn net.Conn
}

// hubLocked adds a consumer to sandbox id's hub (add runs under the hub's
// lock), starting the hub after the first is in: its first session then
// knows what its consumers need (frame hashes). g.mu held.
func (g *Gateway) hubLocked(id string, add func(h *hub)) *hub {
	h := g.hubs[id]
	start := h == nil
	if start {
		ctx, cancel := context.WithCancel(context.Background())
		h = &hub{g: g, id: id, cancel: cancel, done: make(chan struct{}), gone: make(chan struct{}),
			viewers: map[*viewer]struct{}{}, sinks: map[recording.Sink]struct{}{}, ctx: ctx}
		g.hubs[id] = h
	}
	h.mu.Lock()
	add(h)
	h.mu.Unlock()
	if start {
		go h.run(h.ctx)
	}
	return h
}

// joinHub adds a viewer to sandbox id's hub, starting it for the first.
func (g *Gateway) joinHub(id string) (*hub, *viewer) {
	// A new viewer starts from the history: woken at once, it gets it if
	// the hub holds a keyframe, else the next keyframe wakes it.
	v := &viewer{wake: make(chan struct{}, 1), resync: true}
	v.wake <- struct{}{}
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.hubLocked(id, func(h *hub) { h.viewers[v] = struct{}{} })
	return h, v
}

// leave removes v; the last consumer out stops the hub.
func (h *hub) leave(v *viewer) {
	h.release(func() { delete(h.viewers, v) })
}

// release runs remove under the locks and stops the hub when it has no
// consumer left.
func (h *hub) release(remove func()) {
	h.g.mu.Lock()
	h.mu.Lock()
	remove()
	last := len(h.viewers) == 0 && len(h.sinks) == 0
	h.mu.Unlock()
	if last && h.g.hubs[h.id] == h {
		delete(h.g.hubs, h.id)
	}
	h.g.mu.Unlock()
	if last {
		h.cancel()
		<-h.done
	}
}

// Record feeds a recording of sandbox id (recording.Source): the hub's
// frames from the next keyframe on, and the ACI connections the gateway
// opens to the sandbox from now on. detach stops both.
func (g *Gateway) Record(id string, s recording.Sink) (detach func()) {
	var sess *aci.Session
	var stream uint32
	var hashes, upstream bool
	g.mu.Lock()
	h := g.hubLocked(id, func(h *hub) {
		h.sinks[s] = struct{}{}
		sess, stream, hashes, upstream = h.sess, h.stream, h.hashes, h.conn != nil
	})
	g.taps[id] = s
	g.mu.Unlock()
	select {
	case <-h.gone:
		go s.SandboxGone()
	default:
	}
	switch {
	case upstream && !hashes:
		h.drop() // redial with frame hashes: the new stream starts with a keyframe
	case sess != nil:
		go sess.ScreencastKeyframe(context.Background(), stream)
	}
	return func() {
		g.mu.Lock()
		if g.taps[id] == s {
			delete(g.taps, id)
		}
		g.mu.Unlock()
		h.release(func() { delete(h.sinks, s) })
	}
}

// drop closes the upstream connection (a checkpoint is coming); the hub
// reconnects after it, and its viewers stay connected. A connection still
// being dialed is closed too: session checks the route again once its
// connection is where drop finds it.
func (h *hub) drop() {
	h.mu.Lock()
	c := h.conn
	h.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// run keeps a screencast session to the sandbox until the last viewer
// leaves, redialing after a checkpoint, a restore or a guestd restart.
func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		route, err := h.g.router.Route(h.id)
		if errors.Is(err, errdefs.ErrNotFound) {
			close(h.gone)
			for _, s := range h.sinkList() {
				s.SandboxGone()
			}
			return
		}
		if err == nil {
			var streamed bool
			streamed, err = h.session(ctx, route.ACISocket, route.Token)
			if streamed {
				backoff = 100 * time.Millisecond
			}
		}
		if ctx.Err() != nil {
			return
		}
		h.g.log.Debug("view: screencast session ended", "sandbox", h.id, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// watchedConn closes dead when the connection fails: the ACI session
// (without reconnect) does not end by itself when guestd goes away.
type watchedConn struct {
	net.Conn
	once sync.Once
	dead chan struct{}
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.once.Do(func() { close(c.dead) })
	}
	return n, err
}

// session runs one ACI session's screencast and reports whether it
// streamed at all.
func (h *hub) session(ctx context.Context, addr guestsock.Addr, token string) (bool, error) {
	if err := addr.Validate(); err != nil {
		return false, err
	}
	dead := make(chan struct{})
	var wc *watchedConn
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, h.g.dialTimeout)
		defer cancel()
		c, err := guestsock.Dial(ctx, addr) // never a plain path into the sandbox
		if err != nil {
			return nil, err
		}
		wc = &watchedConn{Conn: c, dead: dead}
		h.mu.Lock()
		h.conn = wc
		h.mu.Unlock()
		// A checkpoint that began after run's Route closed what drop found
		// before this connection was there: the route says so now.
		if _, err := h.g.router.Route(h.id); err != nil {
			wc.Close()
			return nil, err
		}
		return wc, nil
	}
	defer func() {
		h.mu.Lock()
		if wc != nil && h.conn == wc {
			h.conn = nil
		}
		h.mu.Unlock()
	}()
	// WithInsecure: the "ws://" names guestd's unix socket, dialed above on
	// this host; no network carries the token.
	s, err := aci.Dial(ctx, "ws://guestd"+aci.DefaultUnixPath, token, aci.WithDialer(dial), aci.WithInsecure(),
		aci.WithClientName("controld-view"), aci.WithReadLimit(viewReadLimit), aci.WithEventBuffer(512))
	if err != nil {
		return false, err
	}
	defer s.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := s.Events(sctx)
	comp := screencast.NewCompositor(screencast.RGBA, screencast.WithKeyframeRequester(screencast.SessionKeyframes(sctx, s)))
	h.mu.Lock()
	hashes := len(h.sinks) > 0
	h.hashes = hashes // a recording that starts from here on redials if false
	h.mu.Unlock()
	stream, err := s.ScreencastStart(sctx, &aciv1.ScreencastStartRequest{
		Fps: viewFPS, Delta: true, Format: aciv1.ImageFormat_IMAGE_FORMAT_ZLIB_RECORDS, Cursor: aciv1.CursorMode_CURSOR_MODE_EVENTS,
		FrameHashes: hashes,
	})
	if err != nil {
		return false, err
	}
	h.mu.Lock()
	h.sess, h.stream = s, stream
	h.history, h.histSize, h.synced = nil, 0, false
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.sess = nil
		h.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-dead:
			return true, net.ErrClosed
		case <-s.Done():
			return true, net.ErrClosed
		case ev, ok := <-events:
			if !ok {
				return true, net.ErrClosed
			}
			switch e := ev.GetEvent().(type) {
			case *aciv1.Event_Frame:
				f := e.Frame
				// More tiles than the browser format counts: skipped, so
				// the compositor sees a gap and asks for a keyframe.
				if len(f.GetTiles()) > math.MaxUint16 {
					continue
				}
				if f.GetStreamId() != stream || comp.Apply(f) != nil {
					continue // the compositor asked for a keyframe if needed
				}
				w, hh := comp.Size()
				h.publish(encodeFrame(f, w, hh), f.GetKeyframe())
				for _, sink := range h.sinkList() {
					if !sink.Frame(f, comp.CapturedAt()) {
						// The recorder skipped it: it goes on from a keyframe.
						go s.ScreencastKeyframe(sctx, stream)
					}
				}
			case *aciv1.Event_Cursor:
				if e.Cursor.GetStreamId() == stream {
					p := e.Cursor.GetPosition()
					h.publishCursor(p)
					for _, sink := range h.sinkList() {
						sink.Cursor(p.GetX(), p.GetY())
					}
				}
			}
		}
	}
}

// sinkList copies the hub's recordings.
func (h *hub) sinkList() []recording.Sink {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.sinks) == 0 {
		return nil
	}
	out := make([]recording.Sink, 0, len(h.sinks))
	for s := range h.sinks {
		out = append(out, s)
	}
	return out
}

// encodeFrame is a frame as view.js reads it (little-endian): kind u8,
// flags u8 (1 keyframe), format u8, 0, width u16, height u16, tiles u16,
// then per tile x, y, w, h u16 and length u32 and its data, then the zlib
// chunk. The compositor accepted the frame: its tiles lie inside the frame.
func encodeFrame(f *aciv1.ScreencastFrame, w, h int) []byte {
	size := 10 + len(f.GetZlibChunk())
	for _, t := range f.GetTiles() {
		size += 12 + len(t.GetData())
	}
	b := make([]byte, 10, size)
	b[0] = msgFrame
	if f.GetKeyframe() {
		b[1] = 1
	}
	format := f.GetFormat()
	if format == aciv1.ImageFormat_IMAGE_FORMAT_UNSPECIFIED {
		format = aciv1.ImageFormat_IMAGE_FORMAT_PNG
	}
	b[2] = byte(format)
	binary.LittleEndian.PutUint16(b[4:], uint16(w))
	binary.LittleEndian.PutUint16(b[6:], uint16(h))
	binary.LittleEndian.PutUint16(b[8:], uint16(len(f.GetTiles())))
	for _, t := range f.GetTiles() {
		r := t.GetRect()
		b = binary.LittleEndian.AppendUint16(b, uint16(r.GetX()))
		b = binary.LittleEndian.AppendUint16(b, uint16(r.GetY()))
		b = binary.LittleEndian.AppendUint16(b, uint16(r.GetWidth()))
		b = binary.LittleEndian.AppendUint16(b, uint16(r.GetHeight()))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(t.GetData())))
		b = append(b, t.GetData()...)
	}
	return append(b, f.GetZlibChunk()...)
}

// publish fans a frame out; a keyframe restarts the history.
func (h *hub) publish(msg []byte, keyframe bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if keyframe {
		h.history, h.histSize, h.synced = nil, 0, true
	}
	if h.synced {
		if h.histSize+len(msg) > maxHistory {
			h.history, h.histSize, h.synced = nil, 0, false
			if s, id := h.sess, h.stream; s != nil {
				go s.ScreencastKeyframe(context.Background(), id)
			}
		} else {
			h.history = append(h.history, msg)
			h.histSize += len(msg)
		}
	}
	for v := range h.viewers {
		h.queue(v, msg)
	}
}

func (h *hub) publishCursor(p *aciv1.Point) {
	msg := make([]byte, 12)
	msg[0] = msgCursor
	binary.LittleEndian.PutUint32(msg[4:], uint32(p.GetX()))
	binary.LittleEndian.PutUint32(msg[8:], uint32(p.GetY()))
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cursor = msg
	for v := range h.viewers {
		h.queue(v, msg)
	}
}

// queue adds msg to v's queue, or makes v resync when it is full. h.mu held.
func (h *hub) queue(v *viewer, msg []byte) {
	if !v.resync {
		if v.bytes+len(msg) > maxPending {
			v.pending, v.bytes, v.resync = nil, 0, true
			v.dropped++
		} else {
			v.pending = append(v.pending, msg)
			v.bytes += len(msg)
		}
	}
	select {
	case v.wake <- struct{}{}:
	default:
	}
}

// take returns what v is to send now: its queue, or the history when it
// resyncs (nothing while the hub waits for a keyframe).
func (h *hub) take(v *viewer) [][]byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v.resync {
		if !h.synced {
			return nil
		}
		v.resync = false
		out := append([][]byte(nil), h.history...)
		if h.cursor != nil {
			out = append(out, h.cursor)
		}
		return out
	}
	out := v.pending
	v.pending, v.bytes = nil, 0
	return out
}

// session returns the current upstream session (nil between sessions).
func (h *hub) upstream() *aci.Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sess
}
