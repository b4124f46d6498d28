package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

func init() {
	cmd := &cobra.Command{
		Use:   "man DIR",
		Short: "write the manual pages, made from the commands' help, to DIR",
		Long: `Man writes a manual page for shale and for each of its commands (shale.1,
shale-mount.1, ...) to DIR, made from the help that --help prints, as
scripts/install.sh installs them:

  shale man /usr/local/share/man/man1`,
		Args:   cobra.ExactArgs(1),
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return fmt.Errorf("manual pages: %v", err)
			}
			root := cmd.Root()
			// The pages differ only where the help does, not by date.
			root.DisableAutoGenTag = true
			h := &doc.GenManHeader{Section: "1", Source: "shale", Manual: "shale manual"}
			if err := doc.GenManTree(root, h, args[0]); err != nil {
				return fmt.Errorf("manual pages in %s: %v", args[0], err)
			}
			return nil
		},
	}
	rootCmd.AddCommand(cmd)
}
