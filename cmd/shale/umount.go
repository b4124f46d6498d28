package main

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "end a shale mount",
		Long: `Umount ends the shale mount at MOUNTPOINT and waits (30 s at most) until its
serving process has ended, a remote lower's disk cache saved, so that the
same mount can be made again at once. It does not wait for a process that
goes on serving other mount points. It fails, changing nothing, while files
are open there.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeMounts,
		RunE:              func(cmd *cobra.Command, args []string) error { return umount(args[0]) },
	})
}

// servingWait bounds how long umount waits for the serving process.
const servingWait = 30 * time.Second

func umount(mnt string) error {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return err
	}
	// No EvalSymlinks: a dead mount cannot be resolved, and is exactly
	// what one wants to unmount.
	if _, fstype, ok := mountedAt(abs); !ok {
		return fmt.Errorf("%s is not a mount point: nothing to unmount", abs)
	} else if !strings.HasPrefix(fstype, "fuse") {
		return fmt.Errorf("%s is a %s mount, not a shale mount: use umount(8)", abs, fstype)
	}
	// Opened before the unmount: once it is done, the serving process
	// may remove the file at any time.
	lock, _ := os.Open(servingLock(abs))
	if lock != nil {
		defer lock.Close()
	}
	dev := devAt(abs)
	err = unix.Unmount(abs, 0)
	if errors.Is(err, syscall.EPERM) && os.Geteuid() != 0 {
		out, ferr := exec.Command("fusermount3", "-u", abs).CombinedOutput()
		if ferr != nil {
			return fmt.Errorf("unmounting %s: %s", abs, strings.TrimSpace(string(out)))
		}
		err = nil
	}
	switch {
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("%s is busy: files are open or a process works there; close them, or detach with umount -l %s", abs, abs)
	case err != nil:
		return fmt.Errorf("unmounting %s: %v", abs, err)
	}
	// A bind mount of the same view left behind keeps it served.
	if lock == nil || dev == "" || devMounted(dev) {
		return nil
	}
	return waitServing(abs, lock)
}

// waitServing waits until the process that served mnt lets go of its
// lock: it has ended, or serves other mount points only.
func waitServing(mnt string, lock *os.File) error {
	deadline := time.Now().Add(servingWait)
	for unix.Flock(int(lock.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			pid, _ := bufio.NewReader(lock).ReadString('\n')
			return fmt.Errorf("unmounted %s, but its serving process (pid %s) has not ended after %v: a new mount with its --cache-dir fails until it has", mnt, strings.TrimSpace(pid), servingWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// devAt is the device (major:minor in mountinfo) mounted at dir.
func devAt(dir string) (dev string) {
	scanMountinfo(func(fields []string) bool {
		if unescapeMountinfo(fields[4]) == dir {
			dev = fields[2]
		}
		return false // the last mount at dir is the one seen there
	})
	return dev
}

// devMounted tells whether dev is mounted anywhere.
func devMounted(dev string) (found bool) {
	scanMountinfo(func(fields []string) bool {
		found = fields[2] == dev
		return found
	})
	return found
}

// scanMountinfo calls fn with the fields of each mount (id parent
// major:minor root mountpoint ...) until it returns true.
func scanMountinfo(fn func(fields []string) bool) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 5 && fn(fields) {
			return
		}
	}
}

// servingLock is the file the process serving mnt holds a lock on
// until it ends (see holdServing).
func servingLock(mnt string) string {
	return filepath.Join(statsDir(), "serving-"+mountHash(mnt)+".lock")
}

// servingLocks are the locks a serving process holds, a slice of files
// for each of its mounts (one file a mount point): shale umount waits
// for them. Each is a new file with the process's pid, so that the
// process an umount -l detached cannot release a later mount's.
type servingLocks struct {
	mu    sync.Mutex
	files [][]*os.File
}

// holdServing takes the locks of mounts' mount points. A lock that
// cannot be made is logged: umount then does not wait.
func holdServing(mounts []*mounted, log *slog.Logger) *servingLocks {
	l := &servingLocks{files: make([][]*os.File, len(mounts))}
	os.MkdirAll(statsDir(), 0o755)
	for i, m := range mounts {
		for _, mnt := range m.mnts {
			p := servingLock(mnt)
			os.Remove(p)
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			if err == nil {
				if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
					f.Close()
				}
			}
			if err != nil {
				log.Warn("no serving lock: shale umount will not wait for this process", "mountpoint", mnt, "err", err)
				continue
			}
			fmt.Fprintf(f, "%d\n", os.Getpid())
			l.files[i] = append(l.files[i], f)
		}
	}
	return l
}

// release lets go of mount i's locks: the process goes on serving
// others, which an umount of i need not wait for.
func (l *servingLocks) release(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.files[i] {
		removeOwn(f)
		f.Close()
	}
	l.files[i] = nil
}

// end removes the lock files; the locks themselves go with the process,
// so that umount waits until it has ended.
func (l *servingLocks) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, fs := range l.files {
		for _, f := range fs {
			removeOwn(f)
		}
	}
}

// removeOwn removes f's name if it is still f's.
func removeOwn(f *os.File) {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) == nil && unix.Stat(f.Name(), &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev {
		os.Remove(f.Name())
	}
}
