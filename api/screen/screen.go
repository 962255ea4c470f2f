// Package screen is the one definition of the screens a sandbox can have:
// controld checks requests and its default with it, guestd its own
// configuration, and the screencast client bounds frames by it. It imports
// nothing, so guestd may use it.
package screen

const (
	// MinEdge and MaxEdge bound a screen's width and height in pixels.
	MinEdge = 64
	MaxEdge = 8192
	// Depth is the one root depth a sandbox runs: guestd captures 32-bit
	// pixels of a 24-bit root, and Xvfb has no depth 32. A request's 0
	// means Depth.
	Depth = 24
)

// EdgeOK reports whether n is a valid width or height.
func EdgeOK(n int) bool { return n >= MinEdge && n <= MaxEdge }

// DepthOK reports whether d is a valid requested depth (0 or Depth).
func DepthOK(d int) bool { return d == 0 || d == Depth }
