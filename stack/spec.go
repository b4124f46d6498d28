package stack

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/shalefs/shale/layer"
)

// A Spec says what a stack is: the lower tree, the layers over it and the
// views of it to mount. The command line's --layer flags and a stack file
// (ParseFile) are two spellings of it.
type Spec struct {
	Lower  string  // a directory, or scheme://... of another backend
	Layers []Layer // bottom-most first
	Views  []View
	// Exports are the layers shale serve offers over 9P.
	Exports []Export
	// CoherenceOff: see Options.
	CoherenceOff bool
	// Logger: see Options.
	Logger *slog.Logger
}

// Layer is one layer of a spec.
type Layer struct {
	Name    string
	Options map[string]string
	// Secret is what the kind's Prepare obtained. It never goes into a
	// file or an argument, and Build clears it once the layer is open.
	Secret []byte
}

// View is one mount of a spec's stack.
type View struct {
	Layer      int // 0: the lower tree itself; i: the i-th layer
	Mountpoint string
}

// Export is one layer of a spec's stack offered over 9P.
type Export struct {
	Layer int    // as View.Layer
	Name  string // the attach name; "" is the default, which "/" names too
}

// Check tells whether every layer is registered and takes the options it
// is given, and every view names a layer of the stack.
func (sp *Spec) Check() error {
	if sp.Lower == "" {
		return fmt.Errorf("the stack needs a lower directory")
	}
	var layers []string
	for _, l := range sp.Layers {
		layers = append(layers, l.Name)
	}
	for i, l := range sp.Layers {
		k, err := Find(l.Name)
		if err != nil {
			return err
		}
		if k.Check != nil {
			if err := k.Check(layers, i); err != nil {
				return err
			}
		}
		for _, o := range sortedKeys(l.Options) {
			if _, ok := k.Options[o]; !ok {
				return fmt.Errorf("layer %s has no option %q%s", l.Name, o, optionList(k))
			}
		}
	}
	seen := map[string]bool{}
	for i, v := range sp.Views {
		if v.Layer < 0 || v.Layer > len(sp.Layers) {
			return fmt.Errorf("view %d needs layer = 0 (the lower directory) to %d", i+1, len(sp.Layers))
		}
		if seen[v.Mountpoint] {
			return fmt.Errorf("mountpoint %s is named twice", v.Mountpoint)
		}
		seen[v.Mountpoint] = true
	}
	names := map[string]bool{}
	for i, e := range sp.Exports {
		if e.Layer < 0 || e.Layer > len(sp.Layers) {
			return fmt.Errorf("export %d needs layer = 0 (the lower directory) to %d", i+1, len(sp.Layers))
		}
		if e.Name != strings.Trim(e.Name, "/") || strings.Contains(e.Name, "/") {
			return fmt.Errorf("export %d: name %q: an attach name is one word without /", i+1, e.Name)
		}
		if names[e.Name] {
			return fmt.Errorf("export name %q is given twice", e.Name)
		}
		names[e.Name] = true
	}
	return nil
}

func optionList(k Kind) string {
	if len(k.Options) == 0 {
		return ": it takes none"
	}
	return ": it takes " + strings.Join(sortedKeys(k.Options), ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Prepare runs the Prepare step of every layer that has one and no secret
// yet. passphrase is as in Prep.
func (sp *Spec) Prepare(passphrase func(file, what string) ([]byte, error)) error {
	for i := range sp.Layers {
		l := &sp.Layers[i]
		k, err := Find(l.Name)
		if err != nil {
			return err
		}
		if k.Prepare == nil || l.Secret != nil {
			continue
		}
		if l.Secret, err = k.Prepare(Prep{Dir: sp.Lower, Layer: *l, Passphrase: passphrase}); err != nil {
			return err
		}
	}
	return nil
}

// Build makes the stack: its bottom and every layer. It returns the nodes,
// bottom first, so that nodes[v.Layer] is what view v shows.
func (sp *Spec) Build(ctx context.Context) (*Stack, []layer.Node, error) {
	if err := sp.Check(); err != nil {
		return nil, nil, err
	}
	st := New(Options{CoherenceOff: sp.CoherenceOff, Logger: sp.Logger})
	bottom, err := OpenLower(st, sp.Lower)
	if err != nil {
		return nil, nil, err
	}
	nodes := []layer.Node{bottom}
	for _, l := range sp.Layers {
		k, _ := Find(l.Name)
		n, err := k.Open(ctx, st, nodes[len(nodes)-1], sp.Lower, l)
		if err != nil {
			return nil, nil, fmt.Errorf("layer %s over %s: %v", l.Name, sp.Lower, err)
		}
		nodes = append(nodes, n)
	}
	// The layers hold their keys now: a passphrase kept for the whole
	// mount would only be there to be found in a core dump or swap.
	for i := range sp.Layers {
		clear(sp.Layers[i].Secret)
		sp.Layers[i].Secret = nil
	}
	return st, nodes, nil
}

// stackFile is the TOML form of a spec:
//
//	lower = "/srv/vault"
//	[[layer]]            # bottom-most first
//	name = "crypt"
//	passfile = "/etc/shale/vault.pass"   # the layer's options
//	[[view]]
//	layer = 1            # 0: the lower directory itself
//	mountpoint = "/mnt/vault"
//	[[export]]           # for shale serve
//	layer = 0
//	name = "raw"         # the attach name; "" (the default) answers to "/" too
type stackFile struct {
	Lower string
	Layer []map[string]any
	View  []struct {
		Layer      *int
		Mountpoint string
	}
	Export []struct {
		Layer *int
		Name  string
	}
}

// ParseFile reads a stack file. Errors name the file.
func ParseFile(path string) (*Spec, error) {
	var sf stackFile
	md, err := toml.DecodeFile(path, &sf)
	if err != nil {
		return nil, fmt.Errorf("stack file %s: %v", path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		return nil, fmt.Errorf("stack file %s: unknown key %q: the keys are lower, [[layer]] name and the layer's options, [[view]] layer and mountpoint, [[export]] layer and name", path, un[0].String())
	}
	if sf.Lower == "" || len(sf.View)+len(sf.Export) == 0 {
		return nil, fmt.Errorf("stack file %s: it needs lower = \"DIR\" and at least one [[view]] or [[export]]", path)
	}
	sp := &Spec{Lower: sf.Lower}
	for i, t := range sf.Layer {
		l := Layer{Options: map[string]string{}}
		for _, key := range sortedKeys(t) {
			s, ok := t[key].(string)
			if !ok {
				return nil, fmt.Errorf("stack file %s: layer %d: %s must be a string", path, i+1, key)
			}
			if key == "name" {
				l.Name = s
			} else {
				l.Options[key] = s
			}
		}
		if l.Name == "" {
			return nil, fmt.Errorf("stack file %s: layer %d needs a name: one of %s", path, i+1, Names())
		}
		sp.Layers = append(sp.Layers, l)
	}
	for i, v := range sf.View {
		if v.Layer == nil {
			return nil, fmt.Errorf("stack file %s: view %d needs layer = 0 (the lower directory) to %d", path, i+1, len(sp.Layers))
		}
		sp.Views = append(sp.Views, View{Layer: *v.Layer, Mountpoint: v.Mountpoint})
	}
	for i, e := range sf.Export {
		if e.Layer == nil {
			return nil, fmt.Errorf("stack file %s: export %d needs layer = 0 (the lower directory) to %d", path, i+1, len(sp.Layers))
		}
		sp.Exports = append(sp.Exports, Export{Layer: *e.Layer, Name: e.Name})
	}
	if err := sp.Check(); err != nil {
		return nil, fmt.Errorf("stack file %s: %v", path, err)
	}
	return sp, nil
}
