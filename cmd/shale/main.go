// Command shale mounts stackable, cache-coherent file systems.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

var rootCmd = &cobra.Command{
	Use:   "shale",
	Short: "stackable, cache-coherent file systems",
	Long: `shale composes file systems from layers over a local directory or a 9P tree
and serves them through FUSE or over 9P2000.L.

  shale mount LOWER MOUNTPOINT    mirror LOWER at MOUNTPOINT (the loop view)
  shale umount MOUNTPOINT         end a mount
  shale serve LOWER               export LOWER over 9P2000.L
  shale mount 9p://HOST:PORT/ MNT mount a 9P export
  shale status                    list the mounts and servers of this machine
  shale LOWER MOUNTPOINT -o OPTS  shale mount -o OPTS, as mount(8) runs it
                                  for type fuse.shale or shale (docs/admin.md)

Each command has a manual page (man shale-mount) made from its --help.`,
	Args: cobra.ArbitraryArgs,
	// As cobra does for a root command without arguments of its own.
	SuggestionsMinimumDistance: 2,
	RunE:                       runRoot,
	SilenceUsage:               true,
	SilenceErrors:              true,
}

// main reports every user-facing error the same way: one line on stderr
// and a non-zero exit, its class's (exit.go). Commands word their errors
// as "what, where, what to do".
func main() {
	usageErrors(rootCmd)
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "shale: %v\n", err)
		os.Exit(exitCode(err))
	}
}
