package writeback

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/shalefs/shale/journal"
	"github.com/shalefs/shale/layer"
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
	w := New(Config{Delay: time.Hour, Send: func(r journal.Record) {
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
	sf.d = &dirty{}
	sf.d.write(0, []byte("new"))
	sf.hasDirty.Store(true)
	sf.mu.Unlock()
	closed := make(chan struct{})
	go func() {
		w.Closing(created, true)
		close(closed)
	}()
	time.Sleep(20 * time.Millisecond) // the close's Held would overtake now
	close(slow)
	<-closed
	<-sent
	last := <-sent
	if size, _, has := journal.HeldOf(&last); !has || size != 3 {
		t.Fatalf("the last Held to land says size %d (delayed writes: %v), want the new file's 3", size, has)
	}
}
