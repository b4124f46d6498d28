package objstore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	ownerEnv  = "OBJSTORE_OWNER_STORE"
	stormEnv  = "OBJSTORE_STORM_STORE"
	stormKeys = 16
)

func formatClosed(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	s, err := Format(path, size, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOwnerSameProcess: a second Store on one store fails while the first
// is open, whether it would own or only read, and readers share.
func TestOwnerSameProcess(t *testing.T) {
	path := formatClosed(t, 1<<20)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{false, true} {
		_, err := Open(path, Options{ReadOnly: ro})
		var iu *InUseError
		if !errors.Is(err, ErrInUse) || !errors.As(err, &iu) || iu.PID != os.Getpid() {
			t.Fatalf("second open (read-only %v) beside an owner: %v, want in use by %d", ro, err, os.Getpid())
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r1, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if _, err := Open(path, Options{}); !errors.Is(err, ErrInUse) {
		t.Fatalf("owner beside readers: %v, want ErrInUse", err)
	}
	r1.Close()
	r2.Close()
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("open after the readers closed: %v", err)
	}
	s.Close()
}

// startOwner re-executes the test binary as a process that opens path,
// says so on stdout and waits to be killed.
func startOwner(t *testing.T, path string, ro bool) *exec.Cmd {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^TestOwnerChild$")
	child.Env = append(os.Environ(), ownerEnv+"="+path, fmt.Sprintf("OBJSTORE_OWNER_RO=%v", ro))
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "open\n" {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("owner process did not open the store: %q", line)
	}
	return child
}

// TestOwnerChild is the process startOwner runs.
func TestOwnerChild(t *testing.T) {
	path := os.Getenv(ownerEnv)
	if path == "" {
		t.Skip("run by TestOwnerTwoProcesses")
	}
	s, err := Open(path, Options{ReadOnly: os.Getenv("OBJSTORE_OWNER_RO") == "true"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if !s.dev.readOnly {
		s.Create("from-child", []byte("child"))
		s.Sync()
	}
	os.Stdout.WriteString("open\n")
	time.Sleep(time.Hour)
}

// TestOwnerTwoProcesses: while one process has a store open, another's
// Open fails with an error naming it; once the first is killed with
// SIGKILL, the store opens.
func TestOwnerTwoProcesses(t *testing.T) {
	if os.Getenv(ownerEnv) != "" {
		t.Skip("this is the child's own run")
	}
	path := formatClosed(t, 1<<20)
	for _, childRO := range []bool{false, true} {
		child := startOwner(t, path, childRO)
		pid := child.Process.Pid
		for _, ro := range []bool{false, true} {
			s, err := Open(path, Options{ReadOnly: ro})
			if ro && childRO {
				if err != nil {
					t.Fatalf("reader beside a reader: %v", err)
				}
				s.Close()
				continue
			}
			if err == nil {
				s.Close()
				child.Process.Kill()
				child.Wait()
				t.Fatalf("open (read-only %v) beside process %d (read-only %v) succeeded", ro, pid, childRO)
			}
			want := fmt.Sprintf("store %s is in use by process %d (%s ", path, pid, os.Args[0])
			if !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "): stop it, or wait") {
				t.Errorf("open beside process %d: %q, want %q...): stop it, or wait", pid, err, want)
			}
		}
		child.Process.Signal(syscall.SIGKILL)
		child.Wait()
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatalf("open after the holder was killed: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// stormObject is version v of key: self-describing bytes, so a read can
// be checked against the version the ledger says was put last.
func stormObject(key string, v int) []byte {
	size := 100 + int(keyHash(key)%(48<<10))
	if key == "k0" {
		size = directMin + 8192
	}
	return Generate(fmt.Sprintf("%s@%d", key, v), size)
}

// The ledger records the last version of each key a process put into the
// store while it owned it. Only the owner touches it, so if ownership is
// exclusive, a read must return that version or miss.
func ledgerGet(dir, key string) int {
	b, err := os.ReadFile(filepath.Join(dir, key))
	if err != nil {
		return 0
	}
	v, _ := strconv.Atoi(string(b))
	return v
}

func ledgerPut(dir, key string, v int) error {
	tmp := filepath.Join(dir, key+".tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(v)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, key))
}

// checkStorm reads every key and compares it with the ledger.
func checkStorm(s *Store, ledger string) (hits int, err error) {
	for i := 0; i < stormKeys; i++ {
		key := fmt.Sprintf("k%d", i)
		v := ledgerGet(ledger, key)
		got, err := s.Read(key)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return hits, fmt.Errorf("read %s: %v", key, err)
		}
		if !bytes.Equal(got, stormObject(key, v)) {
			return hits, fmt.Errorf("read %s: %d bytes that are not version %d, the last put", key, len(got), v)
		}
		hits++
	}
	return hits, nil
}

// TestOwnerStorm runs two processes that take turns owning one store,
// each putting and reading back objects, and kills one or the other with
// SIGKILL at random moments, 30 times or for 20 seconds. After each kill
// the survivor, or the replacement, opens the store; every read in any of
// them returns the last version put or a miss, never other bytes.
func TestOwnerStorm(t *testing.T) {
	if os.Getenv(stormEnv) != "" {
		t.Skip("this is the child's own run")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "store")
	s, err := Format(path, 8<<20, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	ledger := filepath.Join(dir, "ledger")
	os.Mkdir(ledger, 0o755)

	var opens, hits atomic.Int64
	type proc struct {
		cmd    *exec.Cmd
		stderr *bytes.Buffer
		done   chan struct{}
	}
	start := func(seed int) *proc {
		cmd := exec.Command(os.Args[0], "-test.run=^TestOwnerStormChild$")
		cmd.Env = append(os.Environ(), stormEnv+"="+path, "OBJSTORE_STORM_LEDGER="+ledger, fmt.Sprintf("OBJSTORE_STORM_SEED=%d", seed))
		p := &proc{cmd: cmd, stderr: new(bytes.Buffer), done: make(chan struct{})}
		cmd.Stderr = p.stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(p.done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var n int64
				if sc.Text() == "open" {
					opens.Add(1)
				} else if _, err := fmt.Sscanf(sc.Text(), "hits %d", &n); err == nil {
					hits.Add(n)
				}
			}
		}()
		return p
	}
	// stop kills p and fails the test if it had already exited by itself.
	stop := func(p *proc) {
		p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		err := p.cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("storm process %d ended before it was killed (%v): %s", p.cmd.Process.Pid, err, p.stderr)
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	procs := []*proc{start(0), start(1)}
	deadline := time.Now().Add(20 * time.Second)
	cycles := 0
	for ; cycles < 30 && time.Now().Before(deadline); cycles++ {
		time.Sleep(time.Duration(30+rng.IntN(300)) * time.Millisecond)
		i := rng.IntN(2)
		stop(procs[i])
		procs[i] = start(cycles + 2)
	}
	time.Sleep(200 * time.Millisecond)
	stop(procs[0])
	stop(procs[1])

	s, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("open after the storm: %v", err)
	}
	defer s.Close()
	last, err := checkStorm(s, ledger)
	if err != nil {
		t.Fatal(err)
	}
	if opens.Load() < int64(cycles)/2 || hits.Load() == 0 {
		t.Errorf("%d kills but only %d opens and %d verified hits", cycles, opens.Load(), hits.Load())
	}
	t.Logf("%d kills, %d opens and %d verified hits by the storm processes, %d of %d keys hit at the end", cycles, opens.Load(), hits.Load(), last, stormKeys)
}

// TestOwnerStormChild is one of the processes TestOwnerStorm kills. It
// exits with a message only when something is wrong.
func TestOwnerStormChild(t *testing.T) {
	path := os.Getenv(stormEnv)
	if path == "" {
		t.Skip("run by TestOwnerStorm")
	}
	ledger := os.Getenv("OBJSTORE_STORM_LEDGER")
	var seed uint64
	fmt.Sscan(os.Getenv("OBJSTORE_STORM_SEED"), &seed)
	rng := rand.New(rand.NewPCG(seed, 9))
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "storm process %d: "+format+"\n", append([]any{os.Getpid()}, args...)...)
		os.Exit(3)
	}
	for {
		s, err := Open(path, Options{})
		if errors.Is(err, ErrInUse) {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			fail("open: %v", err)
		}
		os.Stdout.WriteString("open\n")
		hits, err := checkStorm(s, ledger)
		if err != nil {
			fail("after open: %v", err)
		}
		for op := 0; op < 20+rng.IntN(100); op++ {
			key := fmt.Sprintf("k%d", rng.IntN(stormKeys))
			v := ledgerGet(ledger, key)
			if rng.IntN(2) == 0 {
				got, err := s.Read(key)
				if err == nil && !bytes.Equal(got, stormObject(key, v)) {
					fail("read %s: %d bytes that are not version %d, the last put", key, len(got), v)
				}
				if err == nil {
					hits++
				}
				if err != nil && !errors.Is(err, ErrNotFound) {
					fail("read %s: %v", key, err)
				}
				continue
			}
			if err := s.Create(key, stormObject(key, v+1)); err != nil {
				fail("put %s: %v", key, err)
			}
			if err := s.Sync(); err != nil {
				fail("sync: %v", err)
			}
			if err := ledgerPut(ledger, key, v+1); err != nil {
				fail("ledger: %v", err)
			}
		}
		if err := s.Close(); err != nil {
			fail("close: %v", err)
		}
		fmt.Printf("hits %d\n", hits)
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
	}
}
