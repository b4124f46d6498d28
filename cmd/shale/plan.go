package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	// The layers and the backend a command line can name.
	"github.com/shalefs/shale/coherence"
	_ "github.com/shalefs/shale/compress"
	_ "github.com/shalefs/shale/crypt"
	"github.com/shalefs/shale/fuseview"
	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9net"
	"github.com/shalefs/shale/remote"
	_ "github.com/shalefs/shale/rot13"
	_ "github.com/shalefs/shale/shard"
	"github.com/shalefs/shale/stack"
	"github.com/shalefs/shale/volume"
	_ "github.com/shalefs/shale/wrap"
)

// A plan is what a mount command asks for: a stack spec, and whether it
// came from a stack file (--stack).
type plan struct {
	spec *stack.Spec
	// stack is set for --stack: views are kept coherent by a manager,
	// unless the spec turns it off.
	stack bool
	// bottom is the built stack's lower root, closed at the end.
	bottom layer.Node
	// given is LOWER as the user gave it: spec.Lower may have a query
	// that the command line's flags added (cachedLower), which is no
	// business of error lines.
	given string
	// The counters of the mounted views, by mountpoint (bind mounts of a
	// view share its), and the stack's coherence manager: shale stats.
	counters map[string]*fuseview.Counters
	manager  *coherence.Manager
	// session follows a 9p:// LOWER's connection, for shale status.
	session *sessionWatch
}

// planMount reads the command line into a plan and checks it.
func planMount(cmd *cobra.Command, f *mountFlags, args []string) (*plan, error) {
	if f.stack == "" {
		if len(args) != 2 {
			return nil, errors.New("mount needs LOWER and MOUNTPOINT (or --stack FILE): see shale mount --help")
		}
		lower, mnt, err := checkMountArgs(args[0], args[1], f.nonempty)
		if err != nil {
			return nil, err
		}
		given := lower
		if lower, err = f.cachedLower(lower); err != nil {
			return nil, err
		}
		sp, err := f.layeredSpec(lower)
		if err != nil {
			return nil, err
		}
		sp.Views = []stack.View{{Layer: len(sp.Layers), Mountpoint: mnt}}
		return &plan{spec: sp, given: given}, sp.Check()
	}
	if len(args) != 0 || len(f.layers) != 0 {
		return nil, errors.New("--stack FILE takes no LOWER, MOUNTPOINT or --layer: the file names them")
	}
	switch f.coherence {
	case "on", "off":
	default:
		return nil, fmt.Errorf("--coherence %q: say on or off", f.coherence)
	}
	sp, err := stack.ParseFile(f.stack)
	if err != nil {
		return nil, err
	}
	sp.CoherenceOff = f.coherence == "off"
	for i := range sp.Layers {
		k, _ := stack.Find(sp.Layers[i].Name)
		sp.Layers[i].Options = f.layerOptions(k, sp.Layers[i].Options)
	}
	for i := range sp.Views {
		lower, mnt, err := checkMountArgs(sp.Lower, sp.Views[i].Mountpoint, f.nonempty)
		if err != nil {
			return nil, fmt.Errorf("stack file %s: view %d: %w", f.stack, i+1, err)
		}
		sp.Lower, sp.Views[i].Mountpoint = lower, mnt
	}
	given := sp.Lower
	if sp.Lower, err = f.cachedLower(sp.Lower); err != nil {
		return nil, err
	}
	if err := sp.Check(); err != nil {
		return nil, fmt.Errorf("stack file %s: %v", f.stack, err)
	}
	return &plan{spec: sp, stack: true, given: given}, nil
}

// cachedLower adds --cache-dir, --cache-size, --write-delay and
// --dirty-max to a 9p:// lower, as the URL's cachedir, cachesize,
// writedelay and dirtymax (remote.OptionsFromQuery), where the URL has
// none of its own. Given for another lower, those of them that were
// changed are a mistake.
func (f *mountFlags) cachedLower(lower string) (string, error) {
	if err := f.checkClientFlags(); err != nil {
		return "", err
	}
	if volume.IsURL(lower) {
		return f.cachedVolume(lower)
	}
	r, ok, err := p9net.ParseRemote(lower)
	if !ok || err != nil {
		switch {
		case f.cacheDir != "":
			return "", fmt.Errorf("--cache-dir %s: only a 9p:// or etcd:// LOWER is cached", f.cacheDir)
		case f.writeDelaySet:
			return "", fmt.Errorf("--write-delay %v: only writes to a 9p:// LOWER are delayed", f.writeDelay)
		case f.dirtyMaxSet:
			return "", fmt.Errorf("--dirty-max %s: only writes to a 9p:// LOWER are delayed", f.dirtyMax)
		}
		return lower, err
	}
	q := url.Values{}
	if f.cacheDir != "" {
		dir, err := filepath.Abs(f.cacheDir)
		if err != nil {
			return "", fmt.Errorf("--cache-dir %s: %v", f.cacheDir, err)
		}
		q.Set("cachedir", dir)
	}
	if f.cacheSize != "" && !r.Query.Has("cachesize") {
		q.Set("cachesize", f.cacheSize)
	}
	if f.client && !r.Query.Has("writedelay") {
		if f.writeDelay == 0 {
			q.Set("writedelay", "0") // write-through
		} else {
			q.Set("writedelay", f.writeDelay.String())
		}
	}
	if f.dirtyMax != "" && !r.Query.Has("dirtymax") {
		q.Set("dirtymax", f.dirtyMax)
	}
	return withQuery(lower, q), nil
}

// withQuery is lower with q added to its query.
func withQuery(lower string, q url.Values) string {
	if len(q) == 0 {
		return lower
	}
	sep := "?"
	if strings.Contains(lower, "?") {
		sep = "&"
	}
	return lower + sep + q.Encode()
}

// cachedVolume adds --cache-dir and --cache-size to a volume's URL as
// its cachedir and cachesize, where it has none of its own. Writes to a
// volume are not delayed (close-to-open), so the delay flags are refused.
func (f *mountFlags) cachedVolume(lower string) (string, error) {
	switch {
	case f.writeDelaySet:
		return "", fmt.Errorf("--write-delay %v: writes to a volume are written back at close and fsync (docs/volume.md)", f.writeDelay)
	case f.dirtyMaxSet:
		return "", fmt.Errorf("--dirty-max %s: writes to a volume are written back at close and fsync (docs/volume.md)", f.dirtyMax)
	}
	_, query, _ := strings.Cut(lower, "?")
	have, err := url.ParseQuery(query)
	if err != nil {
		return "", err
	}
	q := url.Values{}
	if f.cacheDir != "" && !have.Has("cachedir") {
		dir, err := filepath.Abs(f.cacheDir)
		if err != nil {
			return "", fmt.Errorf("--cache-dir %s: %v", f.cacheDir, err)
		}
		q.Set("cachedir", dir)
	}
	if f.cacheSize != "" && !have.Has("cachesize") {
		q.Set("cachesize", f.cacheSize)
	}
	return withQuery(lower, q), nil
}

// checkClientFlags checks --write-delay, --dirty-max and --cache-size, as
// remote would, and says what is wrong in the flags' words.
func (f *mountFlags) checkClientFlags() error {
	if f.writeDelay < 0 {
		return withCode(exitUsage, fmt.Errorf("--write-delay %v: say a positive duration such as 30s, or 0 to write through", f.writeDelay))
	}
	for _, c := range []struct{ flag, key, val string }{{"--dirty-max", "dirtymax", f.dirtyMax}, {"--cache-size", "cachesize", f.cacheSize}} {
		if c.val == "" {
			continue
		}
		if _, err := remote.OptionsFromQuery(url.Values{c.key: {c.val}}); err != nil {
			_, why, _ := strings.Cut(err.Error(), ": ")
			return withCode(exitUsage, fmt.Errorf("%s %s: %s", c.flag, c.val, why))
		}
	}
	return nil
}

// asGivenLower is LOWER as the user gave it.
func (p *plan) asGivenLower() string {
	if p.given == "" {
		return p.spec.Lower // serve's, which adds nothing
	}
	return p.given
}

// asGiven is err with LOWER as the user gave it.
func (p *plan) asGiven(err error) error {
	if err == nil || p.given == "" || p.given == p.spec.Lower {
		return err
	}
	return &shownAs{err, p.spec.Lower, p.given}
}

// shownAs is an error whose text says to where it said from.
type shownAs struct {
	err      error
	from, to string
}

func (e *shownAs) Error() string { return strings.ReplaceAll(e.err.Error(), e.from, e.to) }
func (e *shownAs) Unwrap() error { return e.err }

// closeLower ends the stack's lower: a remote one saves its disk cache.
func (p *plan) closeLower(logger *slog.Logger) {
	if c, ok := p.bottom.(io.Closer); ok {
		if err := c.Close(); err != nil {
			logger.Warn("closing the lower", "lower", p.spec.Lower, "err", err)
		}
	}
}

// layeredSpec is the spec of lower with the command line's --layer flags.
func (f *mountFlags) layeredSpec(lower string) (*stack.Spec, error) {
	sp := &stack.Spec{Lower: lower}
	for _, name := range f.layers {
		k, err := stack.Find(name)
		if err != nil {
			return nil, err
		}
		sp.Layers = append(sp.Layers, stack.Layer{Name: name, Options: f.layerOptions(k, nil)})
	}
	return sp, nil
}

// layerFlags are the command line's options for layers: a flag for each
// option of a registered layer (stack.Kind.Options), which every layer
// that takes it gets.
type layerFlags struct {
	values map[string]*string
}

func (f *layerFlags) register(fl *pflag.FlagSet) {
	f.values = map[string]*string{}
	help := map[string][]string{}
	for _, k := range stack.Kinds() {
		for o, h := range k.Options {
			help[o] = append(help[o], k.Name+": "+h)
		}
	}
	for _, o := range slices.Sorted(maps.Keys(help)) {
		f.values[o] = fl.String(strings.ReplaceAll(o, "_", "-"), "", strings.Join(help[o], "; "))
	}
}

// option is the value the command line gave layer option o, or "".
func (f *layerFlags) option(o string) string {
	if v := f.values[o]; v != nil {
		return *v
	}
	return ""
}

// layerOptions adds to opts the options layer k takes that the command
// line gave and opts lacks.
func (f *layerFlags) layerOptions(k stack.Kind, opts map[string]string) map[string]string {
	if opts == nil {
		opts = map[string]string{}
	}
	for o := range k.Options {
		if v := f.option(o); v != "" && opts[o] == "" {
			opts[o] = v
		}
	}
	return opts
}

func layerHelp() string {
	var b strings.Builder
	for _, k := range stack.Kinds() {
		fmt.Fprintf(&b, "  %-8s %s\n", k.Name, k.Short)
	}
	return b.String()
}

// prepare runs each layer's prepare step (passphrases) in the foreground.
func (p *plan) prepare() error { return p.asGiven(p.spec.Prepare(passphraseFrom)) }

func (p *plan) secrets() []byte {
	var s [][]byte
	for _, l := range p.spec.Layers {
		s = append(s, l.Secret)
	}
	b, _ := json.Marshal(s)
	return b
}

func (p *plan) receiveSecrets(r io.ReadCloser) error {
	defer r.Close()
	var s [][]byte
	b, err := io.ReadAll(r)
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	clear(b) // the secrets live on only in the spec, until Build
	if err != nil || len(s) != len(p.spec.Layers) {
		return fmt.Errorf("the serving process got no secrets from its parent (%v)", err)
	}
	for i := range p.spec.Layers {
		p.spec.Layers[i].Secret = s[i]
	}
	return nil
}

// build makes the stack and starts watching its lower directory; opts are
// what its FUSE views get.
func (p *plan) build(f *mountFlags, logger *slog.Logger) (st *stack.Stack, nodes []layer.Node, opts fuseview.Options, err error) {
	p.spec.Logger = logger
	st, nodes, err = p.spec.Build(context.Background())
	if err != nil {
		return nil, nil, opts, p.asGiven(err)
	}
	p.bottom = nodes[0]
	// Every view is a holder of the stack's manager: changes made through
	// any view, and those other programs make in the lower directory (the
	// watch), are pushed to the others, so the kernel may cache names and
	// attributes long and keep pages across opens. A write through FUSE
	// passthrough is the kernel's own, which the watch sees too.
	opts = fuseview.Options{
		Timeout:     f.timeout,
		AllowOther:  f.allowOther,
		Passthrough: !f.noPassthrough,
		Source:      p.asGivenLower(),
		Debug:       f.debug,
		Coherent:    true,
		KeepCache:   true,
		MountFlags:  f.vfs.flags(),
		// This process never touches its own mounts.
		NoPollHack: true,
	}
	if !f.timeoutSet {
		opts.Timeout = time.Hour
	}
	if _, ok, _ := p9net.ParseRemote(p.spec.Lower); ok {
		opts.Denied = (&rootDenials{log: logger, lower: p.spec.Lower}).denied
	}
	if p.spec.CoherenceOff {
		return st, nodes, opts, nil
	}
	if volume.IsURL(p.spec.Lower) {
		// The volume's etcd watch raises the other clients' changes as
		// events, like the watch of a directory (docs/volume.md).
		return st, nodes, opts, nil
	}
	if _, ok, _ := p9net.ParseRemote(p.spec.Lower); ok {
		if remote.Caching(nodes[0]) {
			// The server's journal controller tells us of other
			// clients' changes, raised as events like the watch's.
			return st, nodes, opts, nil
		}
		// Without a controller other clients' changes go untold: they
		// show within --timeout (remote says so, once, in its log).
		opts.Timeout, opts.KeepCache = f.timeout, false
		return st, nodes, opts, nil
	}
	if _, err := hostfs.Watch(nodes[0], f.watch, logger); err != nil {
		if p.stack {
			return nil, nil, opts, fmt.Errorf("watching %s for changes made beside shale: %v; --coherence=off runs without", p.spec.Lower, err)
		}
		// Unwatched, changes made beside shale are seen only when the
		// kernel asks again: within --timeout, and pages at each open.
		logger.Warn("changes made directly in the lower directory show within --timeout", "lower", p.spec.Lower, "err", err)
		opts.Timeout, opts.KeepCache = f.timeout, false
	}
	return st, nodes, opts, nil
}

// mount builds the stack and mounts its views.
func (p *plan) mount(f *mountFlags, logger *slog.Logger) ([]*mounted, error) {
	st, nodes, opts, err := p.build(f, logger)
	if err != nil {
		return nil, err
	}
	return p.mountViews(st, nodes, opts, logger)
}

// mountViews mounts the views of a built stack.
func (p *plan) mountViews(st *stack.Stack, nodes []layer.Node, opts fuseview.Options, logger *slog.Logger) ([]*mounted, error) {
	var mounts []*mounted
	byLayer := map[int]*mounted{}
	p.manager, p.counters = st.Manager(), map[string]*fuseview.Counters{}
	for _, v := range p.spec.Views {
		if m := byLayer[v.Layer]; m != nil && os.Geteuid() == 0 {
			// Another view of a layer already mounted: a bind mount of
			// it, so both show one set of inodes, and the kernel keeps
			// one page cache for them. Stores through a shared mapping
			// in one are then seen in the other at once (SQLite's WAL
			// index), which no invalidation could give.
			if err := unix.Mount(m.mnts[0], v.Mountpoint, "", unix.MS_BIND, ""); err != nil {
				unmountAll(mounts, logger)
				return nil, fmt.Errorf("mounting %s (layer %d) at %s: bind mount of %s: %v", p.spec.Lower, v.Layer, v.Mountpoint, m.mnts[0], err)
			}
			m.mnts = append(m.mnts, v.Mountpoint)
			p.counters[v.Mountpoint] = p.counters[m.mnts[0]]
			continue
		}
		opts.Counters = new(fuseview.Counters)
		p.counters[v.Mountpoint] = opts.Counters
		var s *fuse.Server
		err := fusermountReason(func() (err error) {
			s, err = fuseview.Mount(v.Mountpoint, st, nodes[v.Layer], opts)
			return err
		})
		if err != nil {
			unmountAll(mounts, logger)
			return nil, fmt.Errorf("mounting %s (layer %d) at %s: %w", p.spec.Lower, v.Layer, v.Mountpoint, err)
		}
		m := &mounted{server: s, mnts: []string{v.Mountpoint}}
		byLayer[v.Layer] = m
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
