package objstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

const (
	crashEnv  = "OBJSTORE_CRASH_STORE"
	crashKeys = 3000
)

// crashObject is the only content key may ever have, so any bytes a read
// returns can be checked without knowing what the killed process did.
// One key in 20 is large enough for the direct-I/O layout.
func crashObject(key string) []byte {
	h := keyHash(key)
	if h%20 == 0 {
		return Generate(key, directMin+int(h%(200<<10)))
	}
	return Generate(key, int(h%(40<<10)))
}

// TestCrash kills a write-heavy process with SIGKILL at a random moment,
// several times over, and checks after each kill that the store opens and
// that every read returns the right bytes or a miss. The child cycles
// through open, a burst of writes, a clean close and an idle pause, so kills
// land in every phase, including mid-Close; a kill during a pause leaves a
// saved index, whose objects are then read back and checked.
func TestCrash(t *testing.T) {
	if os.Getenv(crashEnv) != "" {
		t.Skip("this is the child's own run")
	}
	path := filepath.Join(t.TempDir(), "store")
	s, err := Format(path, 32<<20, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	var hits, cleanRounds int
	for round := 0; round < 8; round++ {
		child := exec.Command(os.Args[0], "-test.run=^TestCrashChild$")
		child.Env = append(os.Environ(), crashEnv+"="+path, fmt.Sprintf("OBJSTORE_CRASH_SEED=%d", round))
		child.Stderr = os.Stderr
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		child.Process.Signal(syscall.SIGKILL)
		child.Wait()

		s, err := Open(path, Options{})
		if err != nil {
			t.Fatalf("round %d: reopen after kill: %v", round, err)
		}
		if s.Stats().CleanOpen {
			cleanRounds++
		}
		for i := 0; i < crashKeys; i++ {
			key := fmt.Sprintf("obj%d", i)
			got, err := s.Read(key)
			if err == nil && !bytes.Equal(got, crashObject(key)) {
				t.Fatalf("round %d: %s: wrong bytes after crash", round, key)
			}
			if err != nil && !errors.Is(err, ErrNotFound) {
				t.Fatalf("round %d: %s: %v", round, key, err)
			}
			if err == nil {
				hits++
			}
		}
		if err := s.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
	}
	t.Logf("8 kills, %d of them while the store was closed: %d hits verified", cleanRounds, hits)
}

// TestCrashChild is the process TestCrash kills.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("run by TestCrash")
	}
	var seed uint64
	fmt.Sscan(os.Getenv("OBJSTORE_CRASH_SEED"), &seed)
	rng := rand.New(rand.NewPCG(seed, 5))
	for {
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for op := 0; op < 300; op++ {
			key := fmt.Sprintf("obj%d", rng.IntN(crashKeys))
			if rng.IntN(10) == 0 {
				s.Remove(key)
				continue
			}
			if err := s.Create(key, crashObject(key)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
	}
}
