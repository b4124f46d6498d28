package crash

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/internal/shaletest"
)

// A stack is one layer configuration under test.
type stack struct {
	name   string
	layers []string
	// prepare readies the lower directory before the first mount and
	// returns extra mount arguments.
	prepare func(t *testing.T, lower string) []string
	rules   lowerRules
	// tornBlocks: the layer authenticates blocks of file data, so a
	// block a killed write or truncate was rewriting may fail to read
	// (crypt).
	tornBlocks bool
	convert    bool // the workload converts directories (shard)
}

var stacks = []stack{
	{name: "loop", rules: plainRules},
	{name: "rot13", layers: []string{"rot13"}, rules: plainRules},
	{name: "crypt", layers: []string{"crypt"}, prepare: initCrypt, rules: cryptRules, tornBlocks: true},
	{name: "shard", layers: []string{"shard"}, prepare: markShard, rules: shardRules, convert: true},
	// compress switches each block's table entry after its new extent is
	// written: a killed write leaves every block old or new, never torn.
	// (Over crypt, a torn crypt block may hold any part of the compressed
	// file, so blocks beyond those written may fail: docs/compress.md.)
	{name: "compress", layers: []string{"compress"}, rules: plainRules},
}

// initCrypt makes lower a crypt directory with a cheap key derivation.
func initCrypt(t *testing.T, lower string) []string {
	args, err := shaletest.InitCrypt(shaleBin, lower, filepath.Join(filepath.Dir(lower), "pass"))
	if err != nil {
		t.Fatal(err)
	}
	return args
}

// markShard manages the lower root (chmod u+s), so that every entry the
// workload makes at the top lives in a bucket.
func markShard(t *testing.T, lower string) []string {
	if err := os.Chmod(lower, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	return nil
}

// The bounds of the test: cycles of mount, check, workload and kill per
// stack, and the operations of each workload.
const (
	cycles       = 25
	maxKillAfter = 80 // the kill comes after 0 to this many operations
	extraOps     = 40 // the workload stops this many operations later
)

// TestCrash mounts each stack, runs a random workload and kills the
// serving process in the middle of it, remounts and checks, cycles times.
func TestCrash(t *testing.T) {
	requireMountable(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SHALE_CRASH_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("SHALE_CRASH_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d: SHALE_CRASH_SEED=%d draws the same operations and kill points, as long as each operation a kill interrupts ends the same way (which depends on timing)", seed, seed)
	for i, st := range stacks {
		t.Run(st.name, func(t *testing.T) { crashStack(t, st, rand.NewPCG(seed, uint64(i))) })
	}
}

func crashStack(t *testing.T, st stack, src rand.Source) {
	base := t.TempDir()
	lower, mnt := filepath.Join(base, "lower"), filepath.Join(base, "mnt")
	for _, d := range []string{lower, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var args []string
	for _, l := range st.layers {
		args = append(args, "--layer", l)
	}
	if st.prepare != nil {
		args = append(args, st.prepare(t, lower)...)
	}
	args = append(args, lower, mnt)
	g := &gen{r: rand.New(src), convert: st.convert}
	cur := tree{}
	var inFlight *op
	var crashed *server // the server killed last, for its log
	for cycle := 0; ; cycle++ {
		srv := startServer(t, mnt, args...)
		end := srv.watch("checking the tree after a remount")
		cur = checkCrash(t, st, lower, mnt, cur, inFlight)
		end()
		srv.reportHangs(t)
		if t.Failed() {
			logServers(t, crashed, srv)
			t.FailNow()
		}
		if cycle == cycles {
			end := srv.watch("removing everything")
			removeAll(t, st, lower, mnt)
			end()
			srv.unmount(t)
			if t.Failed() {
				logServers(t, crashed, srv)
			}
			return
		}
		killAfter := g.r.IntN(maxKillAfter + 1)
		var done int
		cur, inFlight, done = workload(t, srv, mnt, g, cur, killAfter)
		srv.detach(t)
		if inFlight != nil {
			t.Logf("cycle %d: killed after %d operations, during %s", cycle, done, inFlight.desc)
		} else {
			t.Logf("cycle %d: killed after %d operations, between two", cycle, done)
		}
		if t.Failed() {
			logServers(t, srv)
			t.FailNow()
		}
		crashed = srv
	}
}

func logServers(t *testing.T, srvs ...*server) {
	for _, s := range srvs {
		if s == nil {
			continue
		}
		select {
		case <-s.done:
			t.Logf("log of shale mount -f, ended (%v):\n%s", s.err, s.log)
		default:
			t.Logf("log of shale mount -f, running:\n%s", s.log)
		}
	}
}

// workload runs ops through the mount from tree cur, while another
// goroutine kills the server once killAfter of them have completed (at a
// random moment of the next). It returns the tree the completed ops made,
// the op the kill interrupted (nil if it fell between two), and how many
// completed.
func workload(t *testing.T, srv *server, mnt string, g *gen, cur tree, killAfter int) (tree, *op, int) {
	var completed atomic.Int64
	var killed, hung atomic.Bool
	failed := make(chan struct{}) // an op failed on a live mount: kill now
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		last, since := int64(-1), time.Now()
		for n := completed.Load(); n < int64(killAfter); n = completed.Load() {
			if n != last {
				last, since = n, time.Now()
			}
			if time.Since(since) > hangGuard {
				hung.Store(true)
				break
			}
			select {
			case <-failed:
				killed.Store(true)
				srv.kill()
				return
			default:
				time.Sleep(20 * time.Microsecond)
			}
		}
		// Somewhere in the next op (most take 0.1 to 1 ms).
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		killed.Store(true)
		srv.kill()
	}()
	var inFlight *op
	for i := 0; i < killAfter+extraOps; i++ {
		o := g.next(cur)
		err := o.do(mnt)
		if err == nil {
			cur = o.next
			completed.Add(1)
			continue
		}
		switch {
		case hung.Load():
			t.Errorf("hang: op %d, %s, did not return within %v on a live mount; the server was killed", i, o.desc, hangGuard)
		case !killed.Load():
			t.Errorf("op %d, %s, failed on a live mount: %v", i, o.desc, err)
			close(failed)
		case !killedErr(err):
			t.Errorf("op %d, %s, failed with %v as the server was killed; a dead server's requests fail with ECONNABORTED, ENOTCONN or EIO", i, o.desc, err)
		}
		inFlight = &o
		break
	}
	<-killerDone
	return cur, inFlight, int(completed.Load())
}

// killedErr tells the errors of requests a dead server leaves: those in
// flight fail with ECONNABORTED and later ones with ENOTCONN; some fail
// with EIO instead: one whose reply the kill cut off, an open whose reply
// named a passthrough backing file that went with the server (the
// kernel's fuse_file_io_open).
func killedErr(err error) bool {
	return errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.EIO)
}

// removeAll removes everything through the mount, which must work for
// whatever a crash left, and checks that the lower directory then holds
// only the layer's own files of an empty root.
func removeAll(t *testing.T, st stack, lower, mnt string) {
	ents, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatalf("listing %s: %v", mnt, err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(mnt, e.Name())); err != nil {
			t.Errorf("removing through the mount: %v", short(fmt.Sprint(err)))
		}
	}
	obs := observe(mnt)
	if len(obs.tree) != 0 || len(obs.errs) != 0 {
		t.Errorf("after removing everything, the mount holds %d entries (%d errors)", len(obs.tree), len(obs.errs))
	}
	for _, p := range checkLower(lower, obs, st.rules) {
		t.Errorf("lower directory after removing everything: %s", p)
	}
	left, _ := names(lower)
	orphans := 0
	for _, n := range left {
		if strings.HasPrefix(n, linkPrefix) {
			orphans++
		}
	}
	if orphans > 0 {
		t.Logf("%d long symlink targets' sidecars were left over by kills (harmless, docs/crash-safety.md)", orphans)
	}
}
