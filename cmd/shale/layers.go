package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/rot13"
	"github.com/shalefs/shale/wrap"
)

// A layerKind is a layer the command line can stack with --layer.
type layerKind struct {
	name  string
	short string
	// prepare, if set, runs before the mount goes to the background, to
	// ask for what only the user can give (it may fill layerFlags.secret).
	prepare func(dir string, f *layerFlags) error
	// open stacks the layer over lower; dir is the host directory at the
	// bottom of the stack, where layers keep their configuration.
	open func(ctx context.Context, lower layer.Node, dir string, f *layerFlags) (layer.Node, error)
}

// layerFlags are the flags of all layers; each layer reads its own.
type layerFlags struct {
	passfile string
	// secret is what prepare obtained; a background mount receives it
	// through a pipe, never through arguments or the environment.
	secret []byte
}

var layerKinds []layerKind

// registerLayer is called from each layer's init in this package, in a
// file named layer_NAME.go: Go runs init functions in file name order, and
// mount.go's help text lists the layers registered before it.
func registerLayer(k layerKind) { layerKinds = append(layerKinds, k) }

func init() {
	registerLayer(layerKind{
		name:  "null",
		short: "pass everything through (Wrapfs' lofs; the UCLA paper's null layer)",
		open: func(ctx context.Context, lower layer.Node, dir string, f *layerFlags) (layer.Node, error) {
			return wrap.New(ctx, lower, nil)
		},
	})
	registerLayer(layerKind{
		name:  "rot13",
		short: "rot13 file data (the Wrapfs paper's first example)",
		open: func(ctx context.Context, lower layer.Node, dir string, f *layerFlags) (layer.Node, error) {
			return rot13.New(ctx, lower)
		},
	})
}

func (f *layerFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.passfile, "passfile", "", "crypt: read the passphrase from the first line of this file (default: prompt, or stdin when it is not a terminal)")
}

func layerNames() string {
	var names []string
	for _, k := range layerKinds {
		names = append(names, k.name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func layerHelp() string {
	var b strings.Builder
	for _, k := range layerKinds {
		fmt.Fprintf(&b, "  %-8s %s\n", k.name, k.short)
	}
	return b.String()
}

func findLayer(name string) (layerKind, error) {
	i := slices.IndexFunc(layerKinds, func(k layerKind) bool { return k.name == name })
	if i < 0 {
		return layerKind{}, fmt.Errorf("unknown layer %q: choose one of %s", name, layerNames())
	}
	return layerKinds[i], nil
}
