// Package rot13 is the Wrapfs paper's first example layer, kept as the
// smallest example of the wrap template: file data is rot13'd, names and
// everything else pass through.
package rot13

import (
	"context"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
	"github.com/shalefs/shale/wrap"
)

// New stacks rot13 over lower, in st.
func New(ctx context.Context, st *stack.Stack, lower layer.Node) (layer.Node, error) {
	return wrap.New(ctx, st, lower, wrap.Hooks{Blocks: codec{}})
}

func init() {
	stack.Register(stack.Kind{
		Name:  "rot13",
		Short: "rot13 file data (the Wrapfs paper's first example)",
		Open: func(ctx context.Context, st *stack.Stack, lower layer.Node, dir string, l stack.Layer) (layer.Node, error) {
			return New(ctx, st, lower)
		},
	})
}

// codec is a wrap.BlockCodec; rot13 is its own inverse.
type codec struct{}

func (codec) BlockSize() int { return 4096 }
func (codec) Overhead() int  { return 0 }

func (codec) EncodeBlock(dst, hdr []byte, blk uint64, plain []byte) ([]byte, error) {
	n := len(dst)
	dst = append(dst, plain...)
	for i, c := range dst[n:] {
		if l := c | 0x20; 'a' <= l && l <= 'z' { // c|0x20 lowers only letters into a-z
			if l <= 'm' {
				dst[n+i] = c + 13
			} else {
				dst[n+i] = c - 13
			}
		}
	}
	return dst, nil
}

func (c codec) DecodeBlock(dst, hdr []byte, blk uint64, stored []byte) ([]byte, error) {
	return c.EncodeBlock(dst, hdr, blk, stored)
}
