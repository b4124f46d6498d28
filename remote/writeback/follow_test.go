package writeback

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/cache"
)

// The Held records of one QID path land in the order they were made, of
// whichever file holds the number: an unlink and create reuses it, and
// the Held a Follow asked for, made of the old file's state while the
// new one was being opened, must not land after the new file's close
// told its size (the server would show the new file's size as its own
// file's, empty, to every other client: TestCloseToOpen's recreate).
func TestHeldInOrderAcrossReuse(t *testing.T) {
	sent := make(chan journal.Record, 2)
	slow := make(chan struct{})
	var calls atomic.Int32
	w := New(Config{Delay: time.Hour, Cache: cache.New(100, cache.NewMemBlocks(1<<20)), Send: func(r journal.Record) {
		if calls.Add(1) == 1 {
			<-slow // the Follow's Held: its answer is late
		}
		sent <- r
	}})
	defer w.Close()
	w.SetSprite(true)
	w.sfileOf(layer.Token{Ino: 7, Gen: 1}, true) // the removed file's state, clean
	created := layer.Token{Ino: 7, Gen: 2}
	w.Follow(created)
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	sf := w.sfileOf(created, true)
	sf.mu.Lock()
	sf.d = &dirty{since: time.Now()}
	sf.d.write(0, []byte("new"))
	sf.hasDirty.Store(true)
	sf.mu.Unlock()
	closed := make(chan struct{})
	go func() {
		w.Closing(created, true)
		close(closed)
	}()
	// Without the order, the close's Held is sent now, past the Follow's.
	for deadline := time.Now().Add(time.Second); calls.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(slow)
	<-closed
	<-sent
	last := <-sent
	if size, _, has := journal.HeldOf(&last); !has || size != 3 {
		t.Fatalf("the last Held to land says size %d (delayed writes: %v), want the new file's 3", size, has)
	}
}
