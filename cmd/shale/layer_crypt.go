package main

import (
	"context"

	"github.com/shalefs/shale/crypt"
	"github.com/shalefs/shale/layer"
)

func init() {
	registerLayer(layerKind{
		name:  "crypt",
		short: "encrypt data, names and symlinks (needs shale init --layer crypt LOWER first)",
		// The passphrase is asked for, and checked, before the mount goes
		// to the background.
		prepare: func(dir string, f *layerFlags) error {
			pass, err := passphraseFrom(f.passfile, "passphrase for "+dir)
			if err != nil {
				return err
			}
			if _, err := crypt.Open(dir, pass); err != nil {
				return err
			}
			f.secret = pass
			return nil
		},
		open: func(ctx context.Context, lower layer.Node, dir string, f *layerFlags) (layer.Node, error) {
			l, err := crypt.Open(dir, f.secret)
			if err != nil {
				return nil, err
			}
			return l.Stack(ctx, lower)
		},
	})
}
