package wrap

import (
	"context"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// The template with no hooks is the null layer: Wrapfs' lofs, the UCLA
// paper's null layer.
func init() {
	stack.Register(stack.Kind{
		Name:  "null",
		Short: "pass everything through (Wrapfs' lofs; the UCLA paper's null layer)",
		Open: func(ctx context.Context, st *stack.Stack, lower layer.Node, dir string, l stack.Layer) (layer.Node, error) {
			return New(ctx, st, lower, Hooks{})
		},
	})
}
