package containerdrt

import (
	"context"
	"fmt"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

var _ runtime.ImageResolver = (*Runtime)(nil)

// ImageDigest implements runtime.ImageResolver: the manifest digest ref
// names in the runtime's namespace now.
func (r *Runtime) ImageDigest(ctx context.Context, ref string) (string, error) {
	img, err := r.client.GetImage(r.ctx(ctx), ref)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", ref, convertErr(err))
	}
	return img.Target().Digest.String(), nil
}
