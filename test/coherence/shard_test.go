package coherence

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// A shard view shows a managed directory whose entries live, beneath, in
// bucket directories it does not show. Changes there must reach its
// kernel, and that of a view above it, as changes of the managed
// directory: made through another view of the stack, or beside shard in
// the buckets themselves, in LOWER or through a crypt view beneath.

// shardDirs is one managed directory "d" as views of a stack show it.
type shardDirs struct {
	beside string // beneath shard, buckets and all: in LOWER or a view beneath
	shard  string // in the shard view
	above  string // in the rot13 view over shard; "" if the stack has none
}

type shardCheck struct {
	name string
	run  func(t *testing.T, d shardDirs) (got, want string)
}

// bucket is the bucket name lives in beneath a managed directory: the
// on-disk layout of docs/shard.md.
func bucket(name string) string {
	return fmt.Sprintf(".shard-%03x", xxhash.Sum64String(name)>>54)
}

// alsoIn gives a name, other than those in not, in the bucket of not[0].
func alsoIn(not ...string) string {
	for i := 0; ; i++ {
		n := fmt.Sprintf("%s-%d", not[0], i)
		if bucket(n) == bucket(not[0]) && !slices.Contains(not, n) {
			return n
		}
	}
}

// touch makes an empty file.
func touch(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// listed tells whether name is in the listing of dir.
func listed(dir, name string) string { return fmt.Sprint(names(dir)[name]) }

// shardViewChecks change a managed directory through one view on top of
// shard and look through the other.
var shardViewChecks = []shardCheck{
	{"create in shard, list in rot13", func(t *testing.T, d shardDirs) (string, string) {
		names(d.above) // the kernel keeps the listing
		touch(t, filepath.Join(d.shard, "c"))
		return eventually(func() string { return listed(d.above, "c") }, "true")
	}},
	{"remove in shard, look up in rot13", func(t *testing.T, d shardDirs) (string, string) {
		touch(t, filepath.Join(d.shard, "r"))
		mode(filepath.Join(d.above, "r"))
		os.Remove(filepath.Join(d.shard, "r"))
		return eventually(func() string { return mode(filepath.Join(d.above, "r")) }, "no such file or directory")
	}},
	{"rename in rot13, look up and list in shard", func(t *testing.T, d shardDirs) (string, string) {
		touch(t, filepath.Join(d.above, "m"))
		mode(filepath.Join(d.shard, "m"))
		names(d.shard)
		os.Rename(filepath.Join(d.above, "m"), filepath.Join(d.above, "m2"))
		return eventually(func() string {
			return mode(filepath.Join(d.shard, "m")) + " " + listed(d.shard, "m") + " " + listed(d.shard, "m2")
		}, "no such file or directory false true")
	}},
}

// bucketChecks change a managed directory in its buckets, beside shard,
// and look through the shard view. Each first makes a file through the
// view, so that the bucket its names go in exists.
var bucketChecks = []shardCheck{
	{"create in a bucket beside, list and look up in shard", func(t *testing.T, d shardDirs) (string, string) {
		touch(t, filepath.Join(d.shard, "a"))
		names(d.shard)
		n := alsoIn("a")
		touch(t, filepath.Join(d.beside, bucket(n), n))
		return eventually(func() string { return listed(d.shard, n) + " " + mode(filepath.Join(d.shard, n)) }, "true 644")
	}},
	{"remove in a bucket beside, look up and list in shard", func(t *testing.T, d shardDirs) (string, string) {
		touch(t, filepath.Join(d.shard, "y"))
		mode(filepath.Join(d.shard, "y"))
		names(d.shard)
		os.Remove(filepath.Join(d.beside, bucket("y"), "y"))
		return eventually(func() string { return mode(filepath.Join(d.shard, "y")) + " " + listed(d.shard, "y") }, "no such file or directory false")
	}},
	{"rename in a bucket beside, look up in shard", func(t *testing.T, d shardDirs) (string, string) {
		touch(t, filepath.Join(d.shard, "o"))
		n := alsoIn("o")
		mode(filepath.Join(d.shard, "o"))
		os.Rename(filepath.Join(d.beside, bucket("o"), "o"), filepath.Join(d.beside, bucket(n), n))
		return eventually(func() string {
			return mode(filepath.Join(d.shard, "o")) + " " + mode(filepath.Join(d.shard, n))
		}, "no such file or directory 644")
	}},
	{"mkdir in a bucket beside, link count in shard", func(t *testing.T, d shardDirs) (string, string) {
		touch(t, filepath.Join(d.shard, "s"))
		n := alsoIn("s")
		before := nlink(d.shard)
		os.Mkdir(filepath.Join(d.beside, bucket(n), n), 0o755)
		var want int
		fmt.Sscan(before, &want)
		return eventually(func() string { return nlink(d.shard) }, fmt.Sprint(want+1))
	}},
}

// mountShardStacks mounts rot13 over shard, changed beside in LOWER, and
// shard over crypt, changed beside through a crypt view, with a managed
// directory "d" made through each shard view.
func mountShardStacks(t *testing.T, coherence string) (overLower, overCrypt shardDirs) {
	lower, m := mountLayers(t, coherence, []string{"shard", "rot13"}, 1, 2)
	overLower = shardDirs{beside: filepath.Join(lower, "d"), shard: filepath.Join(m[0], "d"), above: filepath.Join(m[1], "d")}
	_, m = mountLayers(t, coherence, []string{"crypt", "shard"}, 1, 2)
	overCrypt = shardDirs{beside: filepath.Join(m[0], "d"), shard: filepath.Join(m[1], "d")}
	for _, d := range []string{overLower.shard, overCrypt.shard} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
	}
	return overLower, overCrypt
}

// runShardChecks runs every check, each with names of its own, and tells
// which held.
func runShardChecks(t *testing.T, coherence string) map[string]bool {
	defer patient(coherence)()
	overLower, overCrypt := mountShardStacks(t, coherence)
	held := map[string]bool{}
	run := func(c shardCheck, where string, d shardDirs) {
		got, want := c.run(t, d)
		name := c.name + " (" + where + ")"
		held[name] = got == want
		t.Logf("coherence=%s: %s: got %q, want %q", coherence, name, got, want)
	}
	for _, c := range shardViewChecks {
		run(c, "rot13 over shard", overLower)
	}
	for _, c := range bucketChecks {
		run(c, "in LOWER", overLower)
		run(c, "through crypt, beneath shard", overCrypt)
	}
	return held
}

func TestShardViewsAreCoherent(t *testing.T) {
	for name, ok := range runShardChecks(t, "on") {
		if !ok {
			t.Errorf("coherence on: %s: stale", name)
		}
	}
}

// Without the manager every check fails: each can, and it is the manager
// that makes it hold.
func TestShardViewsWithoutCoherenceGoStale(t *testing.T) {
	var names []string
	for _, c := range shardViewChecks {
		names = append(names, c.name+" (rot13 over shard)")
	}
	for _, c := range bucketChecks {
		names = append(names, c.name+" (in LOWER)", c.name+" (through crypt, beneath shard)")
	}
	stale := staleOnce(func() map[string]bool { return runShardChecks(t, "off") }, names)
	for _, name := range names {
		if !stale[name] {
			t.Errorf("coherence off: %s held; the check does not exercise coherence", name)
		}
	}
}
