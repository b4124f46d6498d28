package main

// Shell completion (shale completion bash|zsh|fish) beyond file names:
// the registered layers for --layer, and the shale mounts for the
// commands that take one.

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/shalefs/shale/p9net"
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

// completeDirs is LOWER MOUNTPOINT: directories, or, for LOWER once
// "9p" is typed, the 9p:// URL of a shale serve of this machine.
func completeDirs(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) == 0 && len(toComplete) >= 2 && (strings.HasPrefix(toComplete, "9p://") || strings.HasPrefix("9p://", toComplete)) {
		return serverURLs(toComplete), cobra.ShellCompDirectiveNoFileComp
	}
	return nil, cobra.ShellCompDirectiveFilterDirs
}

// completeURLs offers the 9p:// URLs of this machine's servers, for the
// first argument.
func completeURLs(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return serverURLs(toComplete), cobra.ShellCompDirectiveNoFileComp
}

// completeStats offers mounts and servers' URLs.
func completeStats(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	mnts, dir := completeMounts(cmd, args, toComplete)
	urls, _ := completeURLs(cmd, args, toComplete)
	return append(mnts, urls...), dir
}

// serverURLs are the 9p:// URLs beginning with prefix of the exports of
// the servers shale status lists.
func serverURLs(prefix string) []cobra.Completion {
	var urls []cobra.Completion
	for _, l := range statusLines() {
		if l.Server == nil {
			continue
		}
		a, err := p9net.ParseListen(l.Server.Listen)
		if err != nil {
			continue
		}
		for _, aname := range l.Server.Anames {
			u := p9net.Remote{Addr: a, Aname: aname}.String()
			if strings.HasPrefix(u, prefix) {
				urls = append(urls, cobra.CompletionWithDesc(u, "shale serve "+l.Server.Lower))
			}
		}
	}
	return urls
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
