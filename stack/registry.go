package stack

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/shalefs/shale/layer"
)

// A Kind is a layer that specs can name. Layer packages register theirs in
// an init function, so importing a layer's package makes it available.
type Kind struct {
	Name  string
	Short string // one line for help texts
	// Options are the settings the layer takes, each with a line of help.
	// A spec that gives a layer any other option is refused.
	Options map[string]string
	// Prepare, if set, runs before the stack is built, where the user can
	// be asked (the command runs it before going to the background), and
	// returns the secret that Open receives in Layer.Secret.
	Prepare func(p Prep) ([]byte, error)
	// Check, if set, may refuse the place of the layer in a stack: it
	// gets the stack's layer names, bottom-most first, and its index.
	Check func(layers []string, i int) error
	// Open stacks the layer over lower. dir is the directory at the
	// bottom of the stack, where layers keep their configuration.
	Open func(ctx context.Context, st *Stack, lower layer.Node, dir string, l Layer) (layer.Node, error)
}

// Prep is what a Kind's Prepare gets.
type Prep struct {
	Dir   string // the directory at the bottom of the stack
	Layer Layer
	// Passphrase reads a passphrase from file or, when file is "", asks
	// the user for what is described; nil when nobody can be asked.
	Passphrase func(file, what string) ([]byte, error)
}

// A Backend is the bottom of stacks over one kind of lower tree.
type Backend struct {
	// Scheme names the lower trees it serves in a spec's Lower as
	// "scheme://..."; "" is a local directory.
	Scheme string
	Open   func(st *Stack, lower string) (layer.Node, error)
}

var registry struct {
	sync.Mutex
	kinds    []Kind
	backends []Backend
}

// Register makes k available to specs. It panics on a second kind of the
// same name: that is a programming error, found at start.
func Register(k Kind) {
	registry.Lock()
	defer registry.Unlock()
	if slices.ContainsFunc(registry.kinds, func(o Kind) bool { return o.Name == k.Name }) {
		panic("stack: layer " + k.Name + " registered twice")
	}
	registry.kinds = append(registry.kinds, k)
}

// RegisterBackend makes b the bottom of specs whose Lower has its scheme.
func RegisterBackend(b Backend) {
	registry.Lock()
	defer registry.Unlock()
	if slices.ContainsFunc(registry.backends, func(o Backend) bool { return o.Scheme == b.Scheme }) {
		panic("stack: backend " + b.Scheme + " registered twice")
	}
	registry.backends = append(registry.backends, b)
}

// Kinds returns the registered layers, by name.
func Kinds() []Kind {
	registry.Lock()
	defer registry.Unlock()
	ks := slices.Clone(registry.kinds)
	slices.SortFunc(ks, func(a, b Kind) int { return strings.Compare(a.Name, b.Name) })
	return ks
}

// Names lists the registered layers' names, for messages.
func Names() string {
	var names []string
	for _, k := range Kinds() {
		names = append(names, k.Name)
	}
	return strings.Join(names, ", ")
}

// Find returns the kind called name.
func Find(name string) (Kind, error) {
	for _, k := range Kinds() {
		if k.Name == name {
			return k, nil
		}
	}
	return Kind{}, fmt.Errorf("unknown layer %q: choose one of %s", name, Names())
}

func findBackend(lower string) (Backend, error) {
	scheme, _, ok := strings.Cut(lower, "://")
	if !ok {
		scheme = ""
	}
	registry.Lock()
	defer registry.Unlock()
	for _, b := range registry.backends {
		if b.Scheme == scheme {
			return b, nil
		}
	}
	if scheme == "" {
		return Backend{}, fmt.Errorf("no backend for local directories: import github.com/shalefs/shale/hostfs")
	}
	return Backend{}, fmt.Errorf("lower %s: no backend serves %s://", lower, scheme)
}
