package main

import (
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestVersion: shale --version and shale version print the build's
// module and VCS information in one line.
func TestVersion(t *testing.T) {
	info, err := exec.Command("go", "version", "-m", shaleBin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var rev string
	if m := regexp.MustCompile(`vcs\.revision=(\w{12})`).FindSubmatch(info); m != nil {
		rev = string(m[1]) // a build from a git checkout (not a worktree)
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out := run(t, args...)
		if code != 0 || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "shale ") {
			t.Errorf("%q: exit %d, %q; want one line", args, code, out)
		}
		for _, want := range []string{"go-fuse v2.", runtime.Version(), rev} {
			if !strings.Contains(out, want) {
				t.Errorf("%q: %q does not say %q", args, out, want)
			}
		}
	}
}

// TestHelpDefaultsOnce: no flag of any command states its default twice,
// in its help and again as pflag's "(default ...)".
func TestHelpDefaultsOnce(t *testing.T) {
	word := regexp.MustCompile(`\bdefault\b`)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			one := pflag.NewFlagSet("", pflag.ContinueOnError)
			one.AddFlag(f)
			if line := one.FlagUsages(); len(word.FindAllString(line, -1)) > 1 {
				t.Errorf("%s: %s", c.CommandPath(), strings.TrimSpace(line))
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd)
}

// TestCompletion: --layer completes the registered layers, and umount
// the shale mounts.
func TestCompletion(t *testing.T) {
	for _, cmd := range []string{"mount", "serve"} {
		code, out := run(t, "__complete", cmd, "--layer", "")
		for _, want := range []string{"crypt\t", "rot13\t", "compress\t", "shard\t"} {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("%s --layer completes %q, want %q in it", cmd, out, want)
			}
		}
	}
	_, lower, mnt := lowerAndMnt(t)
	mount(t, lower, mnt)
	code, out := run(t, "__complete", "umount", "")
	if code != 0 || !strings.Contains(out, mnt+"\t"+lower+"\n") {
		t.Errorf("umount completes %q, want %s", out, mnt)
	}
}
