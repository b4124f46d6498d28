package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() {
	rootCmd.Version = version()
	// One line, as "shale version" prints it.
	rootCmd.SetVersionTemplate("{{.Version}}\n")
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "print the version: module, commit, Go and go-fuse",
		Long: `Version prints what the binary was built from, in one line: the module's
version ("(devel)" for a build from a checkout), the commit, when it was
made and whether the tree had changes not committed ("+modified"), and the
versions of go-fuse and Go. shale --version prints the same.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Println(version())
			return nil
		},
	})
}

// version is the build's module and VCS information (go build records
// it), as one line:
//
//	shale (devel) commit cc2277b0ab12+modified 2026-11-27T04:12:00Z; go-fuse v2.12.1; go1.26.0 linux/amd64
func version() string {
	v := "shale"
	fuse := "unknown"
	bi, ok := debug.ReadBuildInfo()
	if ok {
		v += " " + bi.Main.Version
		var rev, when, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = "+modified"
				}
			}
		}
		if rev != "" {
			v += fmt.Sprintf(" commit %.12s%s %s", rev, modified, when)
		}
		for _, d := range bi.Deps {
			if d.Path == "github.com/hanwen/go-fuse/v2" {
				fuse = d.Version
			}
		}
	}
	return fmt.Sprintf("%s; go-fuse %s; %s %s/%s", v, fuse, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
