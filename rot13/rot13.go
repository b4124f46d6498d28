// Package rot13 is the Wrapfs paper's first example layer, kept as the
// smallest example of the wrap template: file data is rot13'd, names and
// everything else pass through.
package rot13

import (
	"context"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/wrap"
)

// New stacks rot13 over lower.
func New(ctx context.Context, lower layer.Node) (layer.Node, error) {
	return wrap.New(ctx, lower, codec{})
}

// codec is a wrap.BlockCodec; rot13 is its own inverse.
type codec struct{}

func (codec) BlockSize() int { return 4096 }
func (codec) Overhead() int  { return 0 }

func (codec) EncodeBlock(dst, hdr []byte, blk uint64, plain []byte) ([]byte, error) {
	for _, c := range plain {
		switch {
		case 'a' <= c && c <= 'z':
			c = 'a' + (c-'a'+13)%26
		case 'A' <= c && c <= 'Z':
			c = 'A' + (c-'A'+13)%26
		}
		dst = append(dst, c)
	}
	return dst, nil
}

func (c codec) DecodeBlock(dst, hdr []byte, blk uint64, stored []byte) ([]byte, error) {
	return c.EncodeBlock(dst, hdr, blk, stored)
}
