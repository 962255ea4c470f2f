package aci

import (
	"bytes"
	"container/list"
	"sync"

	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// DefaultFrameCacheBytes bounds a FrameCache made with NewFrameCache(0).
const DefaultFrameCacheBytes = 256 << 20

// FrameCache remembers recent full frames by content hash so sessions can
// ask for a screenshot with if_none_match and, when the server answers
// not_modified, take the image from the cache. Shared by the sessions of a
// forked fleet, it makes N replicas showing the same screen cost one full
// frame per round instead of N. It is bounded (LRU by bytes) and safe for
// concurrent use.
//
// Image bytes of a response served from (or stored in) the cache are shared
// with every other session using it: treat ScreenshotResponse.Data as
// read-only.
type FrameCache struct {
	mu      sync.Mutex
	max     int64
	size    int64
	lru     list.List // of *frameEntry, most recent first
	entries map[entryKey]*list.Element
	latest  map[shapeKey]string // the fleet's most recent hash per request shape

	seq                            uint64 // bumped by every store and hit
	hits, misses, saved, evictions uint64
}

// FrameCacheStats counts what a cache did.
type FrameCacheStats struct {
	// Hits: not_modified replies answered from the cache.
	Hits uint64
	// Misses: full frames received for a request that went through the cache.
	Misses uint64
	// BytesSaved: image bytes the hits did not transfer.
	BytesSaved uint64
	Evictions  uint64
	Entries    int
	Bytes      int64
}

// shapeKey is what makes two screenshot requests return the same bytes for
// the same pixels.
type shapeKey struct {
	format        aciv1.ImageFormat
	quality       uint32
	hasRegion     bool
	x, y, w, h    int32
	maxLongEdge   uint32
	includeCursor bool
}

// entryKey: the hash names the pixels; format and quality the encoding.
type entryKey struct {
	hash    string
	format  aciv1.ImageFormat
	quality uint32
}

type frameEntry struct {
	key    entryKey
	shape  shapeKey
	seq    uint64 // cache seq when first stored
	seen   int    // sessions that received or matched it (capped)
	data   []byte
	width  uint32
	height uint32
	region *aciv1.Rect
}

// NewFrameCache returns a cache holding at most maxBytes of image data
// (DefaultFrameCacheBytes when 0).
func NewFrameCache(maxBytes int64) *FrameCache {
	if maxBytes <= 0 {
		maxBytes = DefaultFrameCacheBytes
	}
	return &FrameCache{
		max:     maxBytes,
		entries: make(map[entryKey]*list.Element),
		latest:  make(map[shapeKey]string),
	}
}

// Stats returns the cache's counters.
func (c *FrameCache) Stats() FrameCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return FrameCacheStats{
		Hits: c.hits, Misses: c.misses, BytesSaved: c.saved, Evictions: c.evictions,
		Entries: len(c.entries), Bytes: c.size,
	}
}

func shapeOf(r *aciv1.ScreenshotRequest) shapeKey {
	k := shapeKey{
		format:        r.GetFormat(),
		maxLongEdge:   r.GetMaxLongEdge(),
		includeCursor: r.GetIncludeCursor(),
	}
	if k.format == aciv1.ImageFormat_IMAGE_FORMAT_UNSPECIFIED {
		k.format = aciv1.ImageFormat_IMAGE_FORMAT_PNG
	}
	if k.format == aciv1.ImageFormat_IMAGE_FORMAT_JPEG {
		k.quality = r.GetQuality()
		if k.quality == 0 {
			k.quality = 80
		}
	}
	if rg := r.GetRegion(); rg != nil {
		k.hasRegion = true
		k.x, k.y, k.w, k.h = rg.GetX(), rg.GetY(), rg.GetWidth(), rg.GetHeight()
	}
	return k
}

func (k shapeKey) entry(hash []byte) entryKey {
	return entryKey{hash: string(hash), format: k.format, quality: k.quality}
}

// candidate picks the frame whose hash goes out as if_none_match. The
// session's own last frame comes first (a replica whose screen diverged from
// the fleet keeps matching its own screen), except when the fleet has
// demonstrably moved on since this session last looked: the fleet's latest
// frame for the shape is newer than the session's observation and at least
// two observations confirmed it. Then the latest is the better bet (a fleet
// that took the same action pays two full frames for the new screen, not N).
// Without an own frame, the fleet's latest.
func (c *FrameCache) candidate(shape shapeKey, own ownFrame) *frameEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ownE, latestE *frameEntry
	if len(own.hash) > 0 {
		if el, ok := c.entries[shape.entry(own.hash)]; ok {
			ownE = el.Value.(*frameEntry)
		}
	}
	if h, ok := c.latest[shape]; ok {
		if el, ok := c.entries[entryKey{hash: h, format: shape.format, quality: shape.quality}]; ok {
			latestE = el.Value.(*frameEntry)
		}
	}
	pick := ownE
	if latestE != nil && (ownE == nil || (latestE != ownE && latestE.seen >= 2 && latestE.seq > own.seq)) {
		pick = latestE
	}
	if pick != nil {
		c.lru.MoveToFront(c.entries[pick.key])
	}
	return pick
}

func (c *FrameCache) lookup(shape shapeKey, hash []byte) *frameEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[shape.entry(hash)]; ok {
		c.lru.MoveToFront(el)
		return el.Value.(*frameEntry)
	}
	return nil
}

// recordHit counts a not_modified served from e and returns the cache seq.
func (c *FrameCache) recordHit(e *frameEntry) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hits++
	c.saved += uint64(len(e.data))
	if e.seen < 1<<20 {
		e.seen++
	}
	c.seq++
	return c.seq
}

// store records a full frame and makes it the fleet's latest for shape; it
// returns the cache seq.
func (c *FrameCache) store(shape shapeKey, r *aciv1.ScreenshotResponse) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.misses++
	c.seq++
	n := int64(len(r.GetData()))
	if n == 0 || len(r.GetFrameHash()) == 0 || n > c.max {
		return c.seq
	}
	key := shape.entry(r.GetFrameHash())
	c.latest[shape] = key.hash
	if el, ok := c.entries[key]; ok {
		c.lru.MoveToFront(el)
		if e := el.Value.(*frameEntry); e.seen < 1<<20 {
			e.seen++
		}
		return c.seq
	}
	e := &frameEntry{
		key: key, shape: shape, seq: c.seq, seen: 1, data: r.GetData(),
		width: r.GetWidth(), height: r.GetHeight(), region: r.GetRegion(),
	}
	c.entries[key] = c.lru.PushFront(e)
	c.size += n
	for c.size > c.max {
		back := c.lru.Back()
		old := back.Value.(*frameEntry)
		c.lru.Remove(back)
		delete(c.entries, old.key)
		c.size -= int64(len(old.data))
		c.evictions++
		if c.latest[old.shape] == old.key.hash {
			delete(c.latest, old.shape)
		}
	}
	return c.seq
}

// FromCache reports whether r's image came from a FrameCache: the server
// answered not_modified and the session filled Data from the cache.
func FromCache(r *aciv1.ScreenshotResponse) bool {
	return r.GetNotModified() && len(r.GetData()) > 0
}

// ownFrame is a session's last frame for a request shape and the cache seq
// when it saw it.
type ownFrame struct {
	hash []byte
	seq  uint64
}

// observe is one screenshot going through the session's dedup machinery.
type observe struct {
	shape shapeKey
	entry *frameEntry // the frame whose hash was sent as if_none_match
	used  bool        // the request went through the cache
}

// prepareObserve returns the request to send (a copy carrying
// if_none_match when the cache has a candidate).
func (s *Session) prepareObserve(req *aciv1.ScreenshotRequest) (*aciv1.ScreenshotRequest, observe) {
	fc := s.cfg.frameCache
	if fc == nil || req == nil || req.GetFormat() == aciv1.ImageFormat_IMAGE_FORMAT_NONE || !s.HasCapability("dedup") {
		return req, observe{}
	}
	ob := observe{shape: shapeOf(req), used: true}
	if inm := req.GetIfNoneMatch(); len(inm) > 0 {
		// The caller chose the hash; fill from the cache only if we hold it.
		ob.entry = fc.lookup(ob.shape, inm)
		return req, ob
	}
	s.lastMu.Lock()
	own := s.lastFrame[ob.shape]
	s.lastMu.Unlock()
	ob.entry = fc.candidate(ob.shape, own)
	if ob.entry == nil {
		return req, ob
	}
	out := proto.CloneOf(req)
	out.IfNoneMatch = []byte(ob.entry.key.hash)
	return out, ob
}

// finishObserve fills a not_modified reply from the cache, or stores a full
// frame in it.
func (s *Session) finishObserve(ob observe, r *aciv1.ScreenshotResponse) {
	if !ob.used || r == nil {
		return
	}
	fc := s.cfg.frameCache
	var seq uint64
	if r.GetNotModified() {
		e := ob.entry
		if e == nil || (len(r.GetFrameHash()) > 0 && !bytes.Equal(r.GetFrameHash(), []byte(e.key.hash))) {
			return // the caller's own if_none_match; nothing to fill in
		}
		// Shared, read-only bytes: the cache never mutates them.
		r.Data = e.data
		r.Format = e.key.format
		if len(r.GetFrameHash()) == 0 {
			r.FrameHash = []byte(e.key.hash)
		}
		if r.GetWidth() == 0 {
			r.Width, r.Height = e.width, e.height
		}
		if r.GetRegion() == nil {
			r.Region = e.region
		}
		seq = fc.recordHit(e)
	} else if len(r.GetData()) > 0 {
		seq = fc.store(ob.shape, r)
	} else {
		return
	}
	s.lastMu.Lock()
	s.lastFrame[ob.shape] = ownFrame{hash: r.GetFrameHash(), seq: seq}
	s.lastMu.Unlock()
}
