package hostfs

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/shalefs/shale/layer"
)

// Sync raises every change made in LOWER before it was called: after a
// program's write returned, a Sync leaves no event of it to come.
func TestSyncRaisesWhatCameBefore(t *testing.T) {
	for _, how := range []string{WatchFanotify, WatchInotify} {
		t.Run(how, func(t *testing.T) {
			dir, root := newFS(t)
			sh(t, dir, "echo 0 > f")
			h := watched(t, root, how)
			f := tokenOf(t, root, filepath.Join(dir, "f"))
			// Another process (fanotify skips shale's own) appends a
			// line each time it is asked, and says when it has.
			cmd := exec.Command("sh", "-c", `while read l; do echo "$l" >> f; echo done; done`)
			cmd.Dir = dir
			in, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			defer in.Close()
			replies := bufio.NewScanner(out)
			missed := 0
			const rounds = 200
			for i := range rounds {
				h.reset()
				if _, err := in.Write([]byte("x\n")); err != nil || !replies.Scan() {
					t.Fatalf("round %d: the writer ended: %v", i, err)
				}
				root.(*node).fs.st.Events().Sync()
				if !h.seen(layer.Event{Kind: layer.Data, Token: f}) {
					missed++
				}
			}
			if missed > 0 {
				t.Errorf("%d of %d writes not raised when Sync returned", missed, rounds)
			}
		})
	}
}
