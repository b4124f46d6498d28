package stack

import (
	"fmt"
	"io"

	"github.com/shalefs/shale/layer"
)

// OpenLower opens lower, a local directory or scheme://... of a registered
// backend, as the bottom of st and returns its root. Spec.Build opens the
// bottom of a stack with it; so do commands that only read or write a file
// in lower (shale init, shale passwd), through UseLower. A program done
// with lower before it exits ends it with CloseLower.
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

// CloseLower releases what OpenLower's root holds. Forget drops the root's
// own resources (a descriptor, fids); a backend that holds more than its
// nodes (remote: a connection, redialled when lost) also has Close, which
// must come first, as nothing may be called after Forget.
func CloseLower(root layer.Node) {
	if c, ok := root.(io.Closer); ok {
		c.Close()
	}
	root.Forget()
}

// UseLower runs fn on the root of lower, opened on a stack of its own and
// closed when fn returns: for a short task such as reading or writing a
// file there (a layer's configuration) before or instead of a mount.
func UseLower(lower string, fn func(root layer.Node) error) error {
	// Nothing else is stacked on it, so the manager has no one to call.
	root, err := OpenLower(New(Options{CoherenceOff: true}), lower)
	if err != nil {
		return err
	}
	defer CloseLower(root)
	return fn(root)
}
