package stack_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/shalefs/shale/crypt"
	_ "github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// A bad stack file gives one error that names the file and what is wrong.
func TestParseFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ toml, want string }{
		{"lower = \"/x\"\n", "at least one [[view]]"},
		{"lower = \"/x\"\n[[layer]]\nname = \"nope\"\n[[view]]\nlayer = 1\nmountpoint = \"/m\"\n", `unknown layer "nope"`},
		{"lower = \"/x\"\n[[layer]]\nname = \"crypt\"\npasfile = \"p\"\n[[view]]\nlayer = 1\nmountpoint = \"/m\"\n", `layer crypt has no option "pasfile": it takes passfile`},
		{"lower = \"/x\"\n[[layer]]\npassfile = \"p\"\n[[view]]\nlayer = 1\nmountpoint = \"/m\"\n", "layer 1 needs a name"},
		{"lower = \"/x\"\n[[layer]]\nname = \"crypt\"\npassfile = 3\n[[view]]\nlayer = 1\nmountpoint = \"/m\"\n", "passfile must be a string"},
		{"lower = \"/x\"\n[[view]]\nlayer = 1\nmountpoint = \"/m\"\n", "view 1 needs layer = 0"},
		{"lower = \"/x\"\n[[view]]\nmountpoint = \"/m\"\n", "view 1 needs layer = 0"},
		{"lower = \"/x\"\n[[view]]\nlayer = 0\nmountpoint = \"/m\"\n[[view]]\nlayer = 0\nmountpoint = \"/m\"\n", "mountpoint /m is named twice"},
		{"lower = \"/x\"\ncolour = 1\n[[view]]\nlayer = 0\nmountpoint = \"/m\"\n", `unknown key "colour"`},
	} {
		f := filepath.Join(dir, "s.toml")
		os.WriteFile(f, []byte(c.toml), 0o644)
		_, err := stack.ParseFile(f)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), f) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: got %v, want one line naming %s and saying %q", c.toml, err, f, c.want)
		}
	}
}

// A good one gives the spec, layer options and all.
func TestParseFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "s.toml")
	os.WriteFile(f, []byte("lower = \"/srv\"\n[[layer]]\nname = \"crypt\"\npassfile = \"/p\"\n[[view]]\nlayer = 0\nmountpoint = \"/raw\"\n[[view]]\nlayer = 1\nmountpoint = \"/m\"\n"), 0o644)
	sp, err := stack.ParseFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if sp.Lower != "/srv" || len(sp.Layers) != 1 || sp.Layers[0].Name != "crypt" || sp.Layers[0].Options["passfile"] != "/p" ||
		len(sp.Views) != 2 || sp.Views[1] != (stack.View{Layer: 1, Mountpoint: "/m"}) {
		t.Errorf("got %+v", sp)
	}
}

func TestParseFileExports(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.toml")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("lower = \"/srv\"\n[[export]]\nlayer = 0\n[[export]]\nlayer = 0\nname = \"raw\"\n")
	sp, err := stack.ParseFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(sp.Exports) != 2 || sp.Exports[0] != (stack.Export{Layer: 0, Name: ""}) || sp.Exports[1] != (stack.Export{Layer: 0, Name: "raw"}) {
		t.Errorf("exports %+v", sp.Exports)
	}
	for body, want := range map[string]string{
		"lower = \"/srv\"\n[[export]]\nlayer = 0\nname = \"a\"\n[[export]]\nlayer = 0\nname = \"a\"\n": "given twice",
		"lower = \"/srv\"\n[[export]]\nlayer = 3\n":                                                    "export 1 needs layer",
		"lower = \"/srv\"\n[[export]]\nname = \"x\"\n":                                                 "export 1 needs layer",
		"lower = \"/srv\"\n[[export]]\nlayer = 0\nname = \"a/b\"\n":                                    "one word",
		"lower = \"/srv\"\n": "at least one [[view]] or [[export]]",
	} {
		write(body)
		if _, err := stack.ParseFile(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}

// Build clears the secrets its layers were opened with: a passphrase
// must not stay in memory for the whole mount.
func TestBuildClearsSecrets(t *testing.T) {
	var got []byte
	stack.Register(stack.Kind{Name: "secretive", Short: "test",
		Open: func(ctx context.Context, st *stack.Stack, lower layer.Node, dir string, l stack.Layer) (layer.Node, error) {
			got = append([]byte(nil), l.Secret...)
			return lower, nil
		}})
	secret := []byte("passphrase")
	sp := &stack.Spec{Lower: t.TempDir(), Layers: []stack.Layer{{Name: "secretive", Secret: secret}}}
	_, nodes, err := sp.Build(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer nodes[0].Forget()
	if string(got) != "passphrase" {
		t.Fatalf("the layer was opened with %q", got)
	}
	if sp.Layers[0].Secret != nil || string(secret) != "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00" {
		t.Errorf("after Build the secret is %q (spec) and %q (its bytes)", sp.Layers[0].Secret, secret)
	}
}
