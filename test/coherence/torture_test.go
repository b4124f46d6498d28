package coherence

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var tortureSeed = flag.Uint64("torture.seed", 0, "seed of TestTorture's steps (0: from the clock)")

const (
	tortureSteps = 3000 // for each watcher
	// tortureGuard bounds one step, not the run: a hang guard only, so
	// that a busy machine makes the run slower, never a failure. A step
	// may wait for the views twice (settle each).
	tortureGuard = 2*settle + time.Minute
)

// TestTorture has three actors change one small tree at random: a loop
// view (layer 0) and a null view (layer 1) of one stack, and this process
// directly in the lower directory. They create, write, rename, unlink and
// truncate files, one step at a time, and after every step each view must
// show what the lower directory holds: names, modes, sizes and contents.
// After a step through a view at once: the manager invalidates the other
// view before the request returns. (It sends without waiting only to a
// view with a request of its own at work on the file, and between steps
// neither view has one.) After a step in the lower directory once the
// watcher has told the views: the check polls for up to settle, and logs
// the slowest agreement. Any other disagreement is a stale read; no step
// fails for being slow, however busy the machine.
func TestTorture(t *testing.T) {
	seed := *tortureSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (go test -run TestTorture -args -torture.seed=%d repeats the steps)", seed, seed)
	for i, how := range []string{"fanotify", "inotify"} {
		t.Run(how, func(t *testing.T) { torture(t, how, seed+uint64(i)) })
	}
}

func torture(t *testing.T, how string, seed uint64) {
	lower := t.TempDir()
	os.Mkdir(filepath.Join(lower, "d"), 0o755)
	m := stackFile{lower: lower, layers: "[[layer]]\nname = \"null\"\n", views: []int{0, 1}}.mount(t, "--watch="+how)
	roots := []string{m[0], m[1], lower} // the actors, by where they act
	actors := []string{"loop view", "null view", "lower"}
	var hung atomic.Bool
	guard := hangGuard(t, &hung, m...)
	defer guard.Stop()

	r := rand.New(rand.NewPCG(seed, seed))
	paths := []string{"a", "b", "c", "d/a", "d/b", "d/c"}
	var stale, late int
	var slowest time.Duration
	done := map[string]int{}
	for step := range tortureSteps {
		guard.Reset(tortureGuard)
		who := r.IntN(len(roots))
		op, err := tortureStep(r, roots[who], lower, paths)
		if err != nil {
			t.Fatalf("step %d: %s: %s: %v", step, actors[who], op, err)
		}
		done[actors[who]+" "+strings.Fields(op)[0]]++
		start := time.Now()
		ds := tortureDisagree(lower, m)
		if who == 2 {
			// The watcher tells the views a moment later; until then
			// they may differ.
			ds = within(func() []string { return tortureDisagree(lower, m) })
			slowest = max(slowest, time.Since(start))
		}
		if hung.Load() {
			t.Fatalf("hang guard: the views' connections were aborted at step %d (%s: %s), which took over %v", step, actors[who], op, tortureGuard)
		}
		if len(ds) > 0 {
			stale += len(ds)
			t.Errorf("step %d: %s: %s: stale:\n%s", step, actors[who], op, strings.Join(ds, "\n"))
			if len(within(func() []string { return tortureDisagree(lower, m) })) == 0 {
				late++ // agreed later: do not count it again at the next step
			} else {
				t.Fatalf("step %d: still stale %v later; stopping", step, settle)
			}
		}
	}
	var counts []string
	for k, n := range done {
		counts = append(counts, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(counts)
	t.Logf("%s: %d steps (%s); %d stale reads (%d views agreed within %v after); slowest agreement after a change in lower: %v",
		how, tortureSteps, strings.Join(counts, ", "), stale, late, settle, slowest)
}

// tortureStep changes one of paths beneath root, choosing among the files
// lower holds, and says what it did.
func tortureStep(r *rand.Rand, root, lower string, paths []string) (string, error) {
	var have, free []string
	for _, p := range paths {
		if _, err := os.Lstat(filepath.Join(lower, p)); err == nil {
			have = append(have, p)
		} else {
			free = append(free, p)
		}
	}
	at := func(p string) string { return filepath.Join(root, p) }
	ops := []string{"create", "write", "rename", "unlink", "truncate"}
	op := ops[r.IntN(len(ops))]
	if len(have) == 0 || (op == "create" && len(free) == 0) {
		op = "write"
	}
	if len(have) == 0 {
		op = "create"
	}
	switch op {
	case "create":
		p := free[r.IntN(len(free))]
		return "create " + p, os.WriteFile(at(p), letters(r, r.IntN(10000)), 0o644)
	case "write":
		p := have[r.IntN(len(have))]
		st, err := os.Stat(filepath.Join(lower, p))
		if err != nil {
			return "write " + p, err
		}
		off := r.Int64N(st.Size() + 100)
		b := letters(r, 1+r.IntN(5000))
		f, err := os.OpenFile(at(p), os.O_WRONLY, 0)
		if err != nil {
			return "write " + p, err
		}
		defer f.Close()
		_, err = f.WriteAt(b, off)
		return fmt.Sprintf("write %s %d bytes at %d", p, len(b), off), err
	case "rename":
		src, dst := have[r.IntN(len(have))], paths[r.IntN(len(paths))]
		if src == dst {
			return "rename " + src + " to itself", nil
		}
		return "rename " + src + " " + dst, os.Rename(at(src), at(dst))
	case "unlink":
		p := have[r.IntN(len(have))]
		return "unlink " + p, os.Remove(at(p))
	}
	p := have[r.IntN(len(have))]
	size := r.Int64N(12000)
	return fmt.Sprintf("truncate %s %d", p, size), os.Truncate(at(p), size)
}

func letters(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(r.IntN(26))
	}
	return b
}

// tortureDisagree lists how each view differs from lower.
func tortureDisagree(lower string, views []string) []string {
	want := tree(lower, false)
	var ds []string
	for _, v := range views {
		for _, d := range differences(tree(v, false), want) {
			ds = append(ds, filepath.Base(v)+": "+d)
		}
	}
	return ds
}

// hangGuard aborts the FUSE connections of mnts when its timer fires (a
// step took over tortureGuard; each step resets it), so that
// system calls waiting on them fail instead of waiting forever, and
// records that in hung.
func hangGuard(t *testing.T, hung *atomic.Bool, mnts ...string) *time.Timer {
	var conns []string
	for _, m := range mnts {
		var st unix.Stat_t
		if err := unix.Stat(m, &st); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", unix.Minor(st.Dev)))
	}
	return time.AfterFunc(tortureGuard, func() {
		hung.Store(true)
		for _, c := range conns {
			os.WriteFile(c, []byte("1"), 0)
		}
	})
}
