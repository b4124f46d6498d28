package stack

import (
	"fmt"

	"github.com/shalefs/shale/layer"
)

// OpenLower opens lower, a local directory or scheme://... of a registered
// backend, as the bottom of st and returns its root. Besides Spec.Build,
// commands that only read or write a file in lower (shale init, shale
// passwd) use it. A program that is done with lower before it exits calls
// the root's Forget, which releases what the backend holds for it (a
// descriptor, a connection).
func OpenLower(st *Stack, lower string) (layer.Node, error) {
	b, err := findBackend(lower)
	if err != nil {
		return nil, err
	}
	root, err := b.Open(st, lower)
	if err != nil {
		return nil, fmt.Errorf("lower directory %s: %v", lower, err)
	}
	return root, nil
}
