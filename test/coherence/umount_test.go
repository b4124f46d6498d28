package coherence

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// servingPid finds the pid in shale umount's complaint that the serving
// process has not ended.
var servingPid = regexp.MustCompile(`\(pid ([0-9]+)\)`)

// unmountView unmounts the view at m with shale (run as shale runs it),
// failing t only for what a busy machine cannot explain. A stack over this
// one may still be ending after its own unmount and hold files here (busy);
// and shale umount waits 30 s for the serving process to end, which a
// loaded machine may exceed: both are waited for, for up to settle, so
// that only a view that stays busy or a process that never ends fails.
func unmountView(t *testing.T, shale func(args ...string) *exec.Cmd, m string) {
	t.Helper()
	out, err := shale("umount", m).CombinedOutput()
	for deadline := time.Now().Add(settle); err != nil && strings.Contains(string(out), "busy") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		out, err = shale("umount", m).CombinedOutput()
	}
	if err != nil && strings.Contains(string(out), "has not ended") {
		// The unmount is done; the process that served it is slow.
		if sub := servingPid.FindStringSubmatch(string(out)); sub != nil {
			if pid, _ := strconv.Atoi(sub[1]); pid > 0 && ends(pid, settle) {
				return
			}
		}
	}
	if err != nil {
		t.Errorf("shale umount: %v: %s", err, out)
		unix.Unmount(m, unix.MNT_DETACH)
	}
}

// ends tells whether process pid ends within d.
func ends(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if unix.Kill(pid, 0) == unix.ESRCH {
			return true
		}
	}
	return false
}
