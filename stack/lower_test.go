package stack_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// closingRoot is the root of a backend that holds a connection: it records
// Close and Forget.
type closingRoot struct {
	layer.Node
	calls *[]string
}

func (r closingRoot) Close() error { *r.calls = append(*r.calls, "close"); return nil }
func (r closingRoot) Forget()      { *r.calls = append(*r.calls, "forget") }

func TestUseLower(t *testing.T) {
	var calls []string
	stack.RegisterBackend(stack.Backend{Scheme: "closing", Open: func(st *stack.Stack, lower string) (layer.Node, error) {
		if lower != "closing://x" {
			return nil, errors.New("no such tree")
		}
		return closingRoot{calls: &calls}, nil
	}})
	failed := errors.New("failed")
	err := stack.UseLower("closing://x", func(layer.Node) error {
		calls = append(calls, "use")
		return failed
	})
	if err != failed || !slices.Equal(calls, []string{"use", "close", "forget"}) {
		t.Errorf("UseLower = %v with calls %q, want fn's error, and the root closed, then forgotten", err, calls)
	}
	use := func(root layer.Node) error { t.Error("fn runs without a lower"); return nil }
	for lower, want := range map[string]string{
		"closing://y": "lower directory closing://y: no such tree",
		"nope://x":    "no backend serves nope://",
	} {
		if err := stack.UseLower(lower, use); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("UseLower(%s) = %v, want %q", lower, err, want)
		}
	}

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
	err = stack.UseLower(dir, func(root layer.Node) error {
		names, err := layer.ReadDirNames(context.Background(), root)
		if !slices.Equal(names, []string{"f"}) {
			t.Errorf("a local lower lists %q, want f", names)
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
}
