package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedPathsAreCurrent fails when paths_gen.go differs from what
// paths.tmpl makes: an edit of the generated file, or of the template
// without regenerating (make generate).
func TestGeneratedPathsAreCurrent(t *testing.T) {
	root := filepath.Join("..", "..", "..")

	want, err := generate(filepath.Join(root, "paths.tmpl"))
	if err != nil {
		t.Fatal(err)
	}

	have, err := os.ReadFile(filepath.Join(root, "paths_gen.go"))
	if err != nil {
		t.Fatal(err)
	}

	if !bytes.Equal(have, want) {
		t.Fatalf("paths_gen.go is not what paths.tmpl makes: run make generate (first difference at byte %d)", firstDiff(have, want))
	}
}

// TestArgsNeedPairs: a snippet called with a name and no value is an error,
// not an empty argument.
func TestArgsNeedPairs(t *testing.T) {
	if _, err := args("key"); err == nil {
		t.Fatal("args(\"key\"): no error")
	}
}

func firstDiff(a, b []byte) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}

	if len(a) < len(b) {
		return len(a)
	}

	return len(b)
}
