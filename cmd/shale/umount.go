package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "end a shale mount",
		Long: `Umount ends the shale mount at MOUNTPOINT; its serving process then exits.
It fails, changing nothing, while files are open there.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return umount(args[0]) },
	})
}

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
	err = unix.Unmount(abs, 0)
	if errors.Is(err, syscall.EPERM) && os.Geteuid() != 0 {
		out, ferr := exec.Command("fusermount3", "-u", abs).CombinedOutput()
		if ferr == nil {
			return nil
		}
		return fmt.Errorf("unmounting %s: %s", abs, strings.TrimSpace(string(out)))
	}
	switch {
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("%s is busy: files are open or a process works there; close them, or detach with umount -l %s", abs, abs)
	case err != nil:
		return fmt.Errorf("unmounting %s: %v", abs, err)
	}
	return nil
}
