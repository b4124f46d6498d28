package main

// Shell completion (shale completion bash|zsh|fish) beyond file names:
// the registered layers for --layer, and the shale mounts for the
// commands that take one.

import (
	"github.com/spf13/cobra"

	"github.com/shalefs/shale/stack"
)

// completeLayers offers every registered layer, with its line of help.
func completeLayers(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
	var names []cobra.Completion
	for _, k := range stack.Kinds() {
		names = append(names, cobra.CompletionWithDesc(k.Name, k.Short))
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completeMounts offers the shale mounts of this machine, for a command
// that takes one MOUNTPOINT.
func completeMounts(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var mnts []cobra.Completion
	for _, m := range shaleMounts() {
		mnts = append(mnts, cobra.CompletionWithDesc(m.dir, m.source))
	}
	return mnts, cobra.ShellCompDirectiveNoFileComp
}

// completeDirs is LOWER MOUNTPOINT: directories.
func completeDirs(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return nil, cobra.ShellCompDirectiveFilterDirs
}

// A shaleMount is a mount of type fuse.shale, as /proc/self/mountinfo
// lists it.
type shaleMount struct {
	dir, source string
}

// shaleMounts lists the shale mounts this process sees, bind mounts of
// views included.
func shaleMounts() []shaleMount {
	var ms []shaleMount
	scanMountinfo(func(fields []string) bool {
		for i, w := range fields {
			if w == "-" && i+2 < len(fields) && fields[i+1] == "fuse.shale" {
				ms = append(ms, shaleMount{dir: unescapeMountinfo(fields[4]), source: unescapeMountinfo(fields[i+2])})
			}
		}
		return false
	})
	return ms
}
