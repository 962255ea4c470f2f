// Package screencast streams a display as damage-driven frames: a keyframe
// (one PNG or JPEG tile covering the frame), then only the rectangles whose
// pixels changed, as PNG, JPEG or zlib tiles. Capture is gated by X DAMAGE:
// a stream whose screen does not change captures nothing and sends nothing.
// A damaged tick fetches only the damaged region and diffs it against what
// the client holds, down to the exact changed rectangles.
//
// Each stream has at most one frame in flight: while its send function
// blocks, damage accumulates as a bounded union and the next frame covers
// it, so a slow client costs guestd neither memory nor stale frames.
//
// The package does not know about sessions: the ACI server (internal/aci)
// owns one Caster per display and plugs Start, Stop and Keyframe into its
// requests and events.
package screencast

import (
	"context"
	"errors"
	"fmt"
	"image"
	"log/slog"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// Display is what a screencast needs from the desktop; *x11.Desktop
// satisfies it.
type Display interface {
	// ScreenSize is the root window size in pixels.
	ScreenSize() (w, h int)
	// Capture copies r (root coordinates, inside the screen) into dst as
	// BGRX with Stride 4*r.Dx(), reusing dst.Pix when large enough.
	Capture(r image.Rectangle, dst *desktop.Frame) error
	// WatchDamage delivers changed rectangles to ch until ctx ends.
	WatchDamage(ctx context.Context, ch chan<- image.Rectangle) error
	// CursorImage is the cursor sprite and its hotspot position.
	CursorImage() (desktop.Cursor, error)
	// CursorPosition is the pointer position in root coordinates.
	CursorPosition() (x, y int, err error)
}

// SendFunc delivers one frame to the client. It may block (that is the
// backpressure); it must return once the client is gone. An error ends the
// stream.
type SendFunc func(*aciv1.ScreencastFrame) error

// CursorFunc delivers a cursor position (CURSOR_MODE_EVENTS).
type CursorFunc func(*aciv1.CursorEvent) error

// Options configure a Caster. The zero value is usable.
type Options struct {
	// MaxStreams caps concurrent streams on the display (all sessions);
	// 0 means DefaultMaxStreams.
	MaxStreams int
	// Logger receives stream failures; nil discards them.
	Logger *slog.Logger
}

// DefaultMaxStreams is the stream cap when Options.MaxStreams is 0.
const DefaultMaxStreams = 16

// Request limits.
const (
	defaultFPS     = 10
	maxFPS         = 60
	defaultQuality = 80
	maxLongEdge    = 1 << 14
)

// watchSettle is how long after the damage watcher starts a stream re-checks
// its whole region once: the display discards damage that piled up while
// nobody watched when the first watcher registers, which can race with the
// first keyframe's capture. The re-check sends nothing when nothing changed.
const watchSettle = 150 * time.Millisecond

// ErrNoStream is in the message of the NOT_FOUND error Stop and Keyframe
// return for an unknown stream id.
var ErrNoStream = errors.New("screencast: no such stream")

// Caster runs the screencasts of one display.
type Caster struct {
	display Display
	log     *slog.Logger
	max     int

	mu         sync.Mutex
	nextID     uint32
	streams    map[uint32]*stream
	watchStop  context.CancelFunc
	watchStart time.Time
	closed     bool
	wg         sync.WaitGroup
}

// New returns a Caster for display.
func New(display Display, opts Options) *Caster {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	max := opts.MaxStreams
	if max <= 0 {
		max = DefaultMaxStreams
	}
	return &Caster{display: display, log: log, max: max, streams: map[uint32]*stream{}}
}

// StartOption adjusts one stream.
type StartOption func(*startConfig)

type startConfig struct {
	zlib   bool
	cursor CursorFunc
	gate   <-chan struct{}
}

// WithZlib enables zlib delta frames for a lossless (PNG) stream: the session
// negotiated CapabilityZlib. Keyframes stay PNG. A request whose format is
// FormatZlib is only accepted with this option.
func WithZlib() StartOption { return func(c *startConfig) { c.zlib = true } }

// WithCursorEvents gives the stream a way to push CursorEvents; required for
// CURSOR_MODE_EVENTS.
func WithCursorEvents(fn CursorFunc) StartOption { return func(c *startConfig) { c.cursor = fn } }

// WithGate holds the stream's first frame until gate is closed: the session
// closes it once the ScreencastStartResponse is queued, so the reply
// carrying the stream id precedes the stream's first event.
func WithGate(gate <-chan struct{}) StartOption { return func(c *startConfig) { c.gate = gate } }

// Start validates req, starts a stream and returns its id. The first frame,
// a keyframe, is sent right away. The stream runs until Stop, StopAll, ctx
// ending (typically the session's context) or send failing. Validation
// failures are *acierr.Error values naming the field under
// "screencast_start".
func (c *Caster) Start(ctx context.Context, req *aciv1.ScreencastStartRequest, send SendFunc, opts ...StartOption) (uint32, error) {
	if send == nil {
		return 0, fmt.Errorf("screencast: nil send function: %w", errdefs.ErrInvalidArgument)
	}
	var sc startConfig
	for _, o := range opts {
		o(&sc)
	}
	sw, sh := c.display.ScreenSize()
	p, err := parseRequest(req, sw, sh, sc)
	if err != nil {
		return 0, err
	}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "screencast: the display is shutting down")
	}
	if len(c.streams) >= c.max {
		c.mu.Unlock()
		return 0, acierr.New(aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED, "",
			"screencast: %d streams already running on this display", c.max)
	}
	c.nextID++
	if c.nextID == 0 {
		c.nextID = 1
	}
	for c.streams[c.nextID] != nil {
		c.nextID++
	}
	id := c.nextID
	sctx, cancel := context.WithCancel(ctx)
	s := newStream(c, id, p, send, sc.cursor, cancel)
	s.gate = sc.gate
	c.streams[id] = s
	c.startWatchLocked()
	if since := time.Since(c.watchStart); since < watchSettle {
		s.recheckAt = c.watchStart.Add(watchSettle)
	}
	c.wg.Add(1)
	c.mu.Unlock()

	go func() {
		defer c.wg.Done()
		err := s.run(sctx)
		c.remove(id, s)
		if err != nil && !errors.Is(err, context.Canceled) {
			c.log.Warn("screencast stream ended", "stream", id, "err", err)
		}
	}()
	return id, nil
}

// Keyframe makes stream id send a keyframe next.
func (c *Caster) Keyframe(id uint32) error {
	c.mu.Lock()
	s := c.streams[id]
	c.mu.Unlock()
	if s == nil {
		return notFound(id)
	}
	s.requestKeyframe()
	return nil
}

// Stop ends stream id. A frame already being sent may still arrive; none is
// built after Stop returns.
func (c *Caster) Stop(id uint32) error {
	c.mu.Lock()
	s := c.streams[id]
	c.mu.Unlock()
	if s == nil {
		return notFound(id)
	}
	s.stop()
	return nil
}

// StopAll ends every stream (a session closing calls Stop for its own ids
// instead).
func (c *Caster) StopAll() {
	c.mu.Lock()
	all := make([]*stream, 0, len(c.streams))
	for _, s := range c.streams {
		all = append(all, s)
	}
	c.mu.Unlock()
	for _, s := range all {
		s.stop()
	}
}

// Close stops every stream, refuses new ones and waits until their
// goroutines have exited or ctx ends (a send blocked on a dead client can
// hold one until its session tears down).
func (c *Caster) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.StopAll()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Streams is the number of running streams.
func (c *Caster) Streams() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.streams)
}

func notFound(id uint32) error {
	// No field: the caller names it ("screencast_stop.stream_id").
	return acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "", "%v: %d", ErrNoStream, id)
}

func (c *Caster) remove(id uint32, s *stream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams[id] == s {
		delete(c.streams, id)
	}
	if len(c.streams) == 0 && c.watchStop != nil {
		// Nobody watches: the display stops re-arming damage, so an
		// unwatched desktop costs no X round trips at all.
		c.watchStop()
		c.watchStop = nil
	}
}

// startWatchLocked runs the one damage watcher of the display, fanning
// rectangles out to every stream. c.mu is held.
func (c *Caster) startWatchLocked() {
	if c.watchStop != nil {
		return
	}
	// A previous watcher may still be winding down; it exits promptly and
	// duplicate damage meanwhile is harmless.
	ctx, cancel := context.WithCancel(context.Background())
	c.watchStop, c.watchStart = cancel, time.Now()
	ch := make(chan image.Rectangle, 64)
	go func() {
		errc := make(chan error, 1)
		go func() { errc <- c.display.WatchDamage(ctx, ch) }()
		for {
			select {
			case r := <-ch:
				c.fanOut(r)
			case err := <-errc:
				if err != nil && ctx.Err() == nil {
					// The display is gone: streams cannot continue.
					c.log.Warn("screencast damage watch failed", "err", err)
					c.failAll(err)
				}
				return
			}
		}
	}()
}

func (c *Caster) fanOut(r image.Rectangle) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.streams {
		s.addDamage(r)
	}
}

func (c *Caster) failAll(err error) {
	c.mu.Lock()
	all := make([]*stream, 0, len(c.streams))
	for _, s := range c.streams {
		all = append(all, s)
	}
	c.mu.Unlock()
	for _, s := range all {
		s.fail(err)
	}
}

// params is a validated ScreencastStartRequest.
type params struct {
	interval    time.Duration // 1/fps
	format      aciv1.ImageFormat
	quality     int
	delta       bool
	zlib        bool // delta tiles as FormatZlib
	keyInterval time.Duration
	maxLongEdge int
	region      image.Rectangle // root coordinates
	cursor      aciv1.CursorMode
	frameHashes bool // frame_hash on delta frames too
}

func parseRequest(req *aciv1.ScreencastStartRequest, sw, sh int, sc startConfig) (params, error) {
	const f = "screencast_start."
	var p params
	if req == nil {
		return p, acierr.Invalid("screencast_start", "missing request")
	}
	fps := int(req.GetFps())
	if fps == 0 {
		fps = defaultFPS
	}
	if fps > maxFPS {
		return p, acierr.Invalid(f+"fps", "fps %d: at most %d", fps, maxFPS)
	}
	p.interval = time.Second / time.Duration(fps)
	p.format = req.GetFormat()
	p.delta = req.GetDelta()
	switch p.format {
	case aciv1.ImageFormat_IMAGE_FORMAT_UNSPECIFIED, aciv1.ImageFormat_IMAGE_FORMAT_PNG:
		p.format = aciv1.ImageFormat_IMAGE_FORMAT_PNG
		p.zlib = sc.zlib && p.delta
	case aciv1.ImageFormat_IMAGE_FORMAT_JPEG, aciv1.ImageFormat_IMAGE_FORMAT_NONE:
	case FormatZlib, aciv1.ImageFormat_IMAGE_FORMAT_ZLIB_BGR:
		// ZLIB_BGR names the zlib deltas of older clients; they are sent
		// as FormatZlib either way.
		if !sc.zlib {
			return p, acierr.Invalid(f+"format", "format %d needs the %q capability", int32(p.format), CapabilityZlib)
		}
		if !p.delta {
			return p, acierr.Invalid(f+"format", "zlib frames need delta=true (keyframes are PNG)")
		}
		p.format, p.zlib = aciv1.ImageFormat_IMAGE_FORMAT_PNG, true
	default:
		return p, acierr.Invalid(f+"format", "unknown image format %d", int32(p.format))
	}
	q := int(req.GetQuality())
	if q > 100 {
		return p, acierr.Invalid(f+"quality", "quality %d: want 1..100", q)
	}
	if q == 0 {
		q = defaultQuality
	}
	p.quality = q
	p.keyInterval = time.Duration(req.GetKeyframeIntervalMs()) * time.Millisecond
	p.maxLongEdge = int(req.GetMaxLongEdge())
	if p.maxLongEdge > maxLongEdge {
		return p, acierr.Invalid(f+"max_long_edge", "max_long_edge %d: at most %d", p.maxLongEdge, maxLongEdge)
	}
	screen := image.Rect(0, 0, sw, sh)
	if screen.Empty() {
		return p, acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "screencast: the display reports an empty screen")
	}
	p.region = screen
	if r := req.GetRegion(); r != nil {
		rr := image.Rect(int(r.GetX()), int(r.GetY()), int(r.GetX())+int(r.GetWidth()), int(r.GetY())+int(r.GetHeight()))
		if r.GetWidth() <= 0 || r.GetHeight() <= 0 || !rr.In(screen) {
			return p, acierr.Invalid(f+"region", "region %v must be non-empty and inside the %dx%d screen", rr, sw, sh)
		}
		p.region = rr
	}
	p.frameHashes = req.GetFrameHashes()
	p.cursor = req.GetCursor()
	switch p.cursor {
	case aciv1.CursorMode_CURSOR_MODE_UNSPECIFIED, aciv1.CursorMode_CURSOR_MODE_HIDDEN:
		p.cursor = aciv1.CursorMode_CURSOR_MODE_HIDDEN
	case aciv1.CursorMode_CURSOR_MODE_OVERLAY:
	case aciv1.CursorMode_CURSOR_MODE_EVENTS:
		if sc.cursor == nil {
			return p, acierr.Invalid(f+"cursor", "cursor events are not available on this connection")
		}
	default:
		return p, acierr.Invalid(f+"cursor", "unknown cursor mode %d", int32(p.cursor))
	}
	return p, nil
}
