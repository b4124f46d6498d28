package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/coherence"
	"github.com/shalefs/shale/fuseview"
	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
)

// A plan is what a mount command asks for: a stack over a lower directory
// and the views of it to mount.
type plan struct {
	lower  string
	layers []planLayer // bottom-most first
	views  []planView
	// stack is set for --stack: views are kept coherent by a manager,
	// unless coherenceOff.
	stack        bool
	coherenceOff bool
}

type planLayer struct {
	name  string
	flags layerFlags
}

type planView struct {
	layer int // 0: the lower directory; i: the i-th layer
	mnt   string
}

// stackFile is the TOML of --stack.
type stackFile struct {
	Lower string
	Layer []struct {
		Name     string
		Passfile string
	}
	View []struct {
		Layer      *int
		Mountpoint string
	}
}

// planMount reads the command line into a plan and checks it.
func planMount(cmd *cobra.Command, f *mountFlags, args []string) (*plan, error) {
	if f.stack == "" {
		if len(args) != 2 {
			return nil, errors.New("mount needs LOWER and MOUNTPOINT (or --stack FILE): see shale mount --help")
		}
		lower, mnt, err := checkMountArgs(args[0], args[1])
		if err != nil {
			return nil, err
		}
		p := &plan{lower: lower}
		for _, name := range f.layers {
			p.layers = append(p.layers, planLayer{name, f.layerFlags})
		}
		p.views = []planView{{len(p.layers), mnt}}
		return p, p.checkLayers()
	}
	if len(args) != 0 || len(f.layers) != 0 {
		return nil, errors.New("--stack FILE takes no LOWER, MOUNTPOINT or --layer: the file names them")
	}
	switch f.coherence {
	case "on", "off":
	default:
		return nil, fmt.Errorf("--coherence %q: say on or off", f.coherence)
	}
	var sf stackFile
	md, err := toml.DecodeFile(f.stack, &sf)
	if err != nil {
		return nil, fmt.Errorf("stack file %s: %v", f.stack, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		return nil, fmt.Errorf("stack file %s: unknown key %q: the keys are lower, [[layer]] name and passfile, [[view]] layer and mountpoint", f.stack, un[0].String())
	}
	if sf.Lower == "" || len(sf.View) == 0 {
		return nil, fmt.Errorf("stack file %s: it needs lower = \"DIR\" and at least one [[view]]", f.stack)
	}
	p := &plan{stack: true, coherenceOff: f.coherence == "off"}
	for _, l := range sf.Layer {
		fl := f.layerFlags
		if l.Passfile != "" {
			fl.passfile = l.Passfile
		}
		p.layers = append(p.layers, planLayer{l.Name, fl})
	}
	seen := map[string]bool{}
	for i, v := range sf.View {
		if v.Layer == nil || *v.Layer < 0 || *v.Layer > len(p.layers) {
			return nil, fmt.Errorf("stack file %s: view %d needs layer = 0 (the lower directory) to %d", f.stack, i+1, len(p.layers))
		}
		lower, mnt, err := checkMountArgs(sf.Lower, v.Mountpoint)
		if err != nil {
			return nil, fmt.Errorf("stack file %s: view %d: %v", f.stack, i+1, err)
		}
		if seen[mnt] {
			return nil, fmt.Errorf("stack file %s: mountpoint %s is named twice", f.stack, mnt)
		}
		seen[mnt] = true
		p.lower = lower
		p.views = append(p.views, planView{*v.Layer, mnt})
	}
	return p, p.checkLayers()
}

func (p *plan) checkLayers() error {
	for _, l := range p.layers {
		if _, err := findLayer(l.name); err != nil {
			return err
		}
	}
	return nil
}

// prepare runs each layer's prepare step (passphrases) in the foreground.
func (p *plan) prepare() error {
	for i := range p.layers {
		k, _ := findLayer(p.layers[i].name)
		if k.prepare != nil {
			if err := k.prepare(p.lower, &p.layers[i].flags); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *plan) secrets() []byte {
	var s [][]byte
	for _, l := range p.layers {
		s = append(s, l.flags.secret)
	}
	b, _ := json.Marshal(s)
	return b
}

func (p *plan) receiveSecrets(r io.ReadCloser) error {
	defer r.Close()
	var s [][]byte
	if err := json.NewDecoder(r).Decode(&s); err != nil || len(s) != len(p.layers) {
		return fmt.Errorf("the serving process got no secrets from its parent (%v)", err)
	}
	for i := range p.layers {
		p.layers[i].flags.secret = s[i]
	}
	return nil
}

// mount builds the stack and mounts its views.
func (p *plan) mount(f *mountFlags) ([]*mounted, error) {
	ctx := context.Background()
	host, err := hostfs.New(p.lower)
	if err != nil {
		return nil, fmt.Errorf("lower directory %s: %v", p.lower, err)
	}
	nodes := []layer.Node{host}
	for _, l := range p.layers {
		k, _ := findLayer(l.name)
		n, err := k.open(ctx, nodes[len(nodes)-1], p.lower, &l.flags)
		if err != nil {
			return nil, fmt.Errorf("layer %s over %s: %v", l.name, p.lower, err)
		}
		nodes = append(nodes, n)
	}
	opts := fuseview.Options{
		Timeout:     f.timeout,
		AllowOther:  f.allowOther,
		Passthrough: !f.noPassthrough,
		Source:      p.lower,
		Debug:       f.debug,
	}
	if p.stack {
		// Changes are pushed to every view, so the kernel may cache long
		// and keep pages across opens. Passthrough would let the kernel
		// write beside the manager, so views serve data themselves.
		opts.Coherence = coherence.New(host.(layer.EventSource).Events(), p.coherenceOff)
		opts.KeepCache = true
		if !p.coherenceOff {
			// Changes other programs make in the lower directory.
			if _, err := hostfs.Watch(host); err != nil {
				return nil, fmt.Errorf("watching %s for changes made beside shale: %v; run as root, or use --coherence=off", p.lower, err)
			}
		}
		opts.Passthrough = false
		if !f.timeoutSet {
			opts.Timeout = time.Hour
		}
	}
	var mounts []*mounted
	byLayer := map[int]*mounted{}
	for _, v := range p.views {
		if m := byLayer[v.layer]; m != nil && os.Geteuid() == 0 {
			// Another view of a layer already mounted: a bind mount of
			// it, so both show one set of inodes, and the kernel keeps
			// one page cache for them. Stores through a shared mapping
			// in one are then seen in the other at once (SQLite's WAL
			// index), which no invalidation could give.
			if err := unix.Mount(m.mnts[0], v.mnt, "", unix.MS_BIND, ""); err != nil {
				unmountAll(mounts, slog.New(slog.DiscardHandler))
				return nil, fmt.Errorf("mounting %s (layer %d) at %s: bind mount of %s: %v", p.lower, v.layer, v.mnt, m.mnts[0], err)
			}
			m.mnts = append(m.mnts, v.mnt)
			continue
		}
		s, err := fuseview.Mount(v.mnt, nodes[v.layer], opts)
		if err != nil {
			unmountAll(mounts, slog.New(slog.DiscardHandler))
			return nil, fmt.Errorf("mounting %s (layer %d) at %s: %v", p.lower, v.layer, v.mnt, err)
		}
		m := &mounted{server: s, mnts: []string{v.mnt}}
		byLayer[v.layer] = m
		mounts = append(mounts, m)
	}
	return mounts, nil
}

// mounted is one FUSE mount of a layer and the mountpoints that show it:
// its first view and bind mounts of it. The server ends when the last of
// them is unmounted.
type mounted struct {
	server *fuse.Server
	mnts   []string
}
