package main

// mount --help is short: what the command does, examples and the common
// flags. --help-all prints the whole help, as the man page has it (made
// from the same command: shale man).

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/shalefs/shale/stack"
)

// mountCommonFlags are the flags mount --help shows.
var mountCommonFlags = []string{"layer", "passfile", "options", "foreground", "nonempty", "allow-other", "timeout", "log", "debug", "help-all"}

func mountShortHelp() string {
	return `Mount serves the directory LOWER at MOUNTPOINT through FUSE, through the
layers --layer stacks, bottom-most first; without, it mirrors LOWER. LOWER
may be a 9P server's tree: 9p://HOST:PORT/ANAME or 9p:///path/to.sock. It
returns once the mount is ready and serves in the background; "shale umount
MOUNTPOINT" ends it.

  shale mount /srv/data /mnt/data
  shale init --layer crypt /srv/vault          # once, before the first mount
  shale mount --layer crypt --passfile /etc/shale/vault.pass /srv/vault /mnt/vault
  shale mount 9p://fileserver:5640/ /mnt/work

Layers: ` + stack.Names() + `.`
}

// shortMountHelp gives cmd (mount) its short help and --help-all.
func shortMountHelp(cmd *cobra.Command) {
	var all bool
	cmd.Flags().BoolVar(&all, "help-all", false, "print the whole help: every flag, the layers, --stack files, caching and delayed writes (as man shale-mount)")
	full := cmd.HelpFunc()
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		if all {
			full(c, args)
			return
		}
		w := c.OutOrStdout()
		fmt.Fprintf(w, "%s\n\nUsage:\n  %s\n\nCommon flags:\n", mountShortHelp(), c.UseLine())
		common := pflag.NewFlagSet("", pflag.ContinueOnError)
		for _, name := range mountCommonFlags {
			common.AddFlag(c.Flags().Lookup(name))
		}
		fmt.Fprint(w, common.FlagUsages())
		fmt.Fprintln(w, "\nEvery flag (a 9p:// LOWER's cache and delayed writes, --stack, --metrics ...) and the details: shale mount --help-all, or man shale-mount.")
	})
	// --help-all is no help flag to cobra: the command runs, and prints
	// the whole help instead of mounting.
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if all {
			full(c, args)
			return nil
		}
		return run(c, args)
	}
}
