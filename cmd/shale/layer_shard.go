package main

import (
	"context"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/shard"
)

func init() {
	registerLayer(layerKind{
		name:  "shard",
		short: "huge flat directories kept in hashed subdirectories (Usenetfs); chmod u+s DIR marks one",
		open: func(ctx context.Context, lower layer.Node, dir string, f *layerFlags) (layer.Node, error) {
			return shard.New(ctx, lower)
		},
	})
}
