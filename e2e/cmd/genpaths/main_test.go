package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedPathsAreCurrent fails when a file paths.tmpl writes
// (paths_gen.go and those after a fileMarker) differs from what it makes: an
// edit of a generated file, or of the template without regenerating (make
// generate).
func TestGeneratedPathsAreCurrent(t *testing.T) {
	root := filepath.Join("..", "..", "..")

	outs, err := generate(filepath.Join(root, "paths.tmpl"))
	if err != nil {
		t.Fatal(err)
	}

	for _, o := range outs {
		have, err := os.ReadFile(filepath.Join(root, o.path))
		if err != nil {
			t.Fatal(err)
		}

		if !bytes.Equal(have, o.src) {
			t.Fatalf("%s is not what paths.tmpl makes: run make generate (first difference at byte %d)", o.path, firstDiff(have, o.src))
		}
	}
}

// TestMarkerSplitsFiles: the text after a fileMarker line is a file of its
// own, formatted, with the generated header.
func TestMarkerSplitsFiles(t *testing.T) {
	dir := t.TempDir()
	tmpl := "package a\n\nfunc A() {}\n" + fileMarker + "b/b_gen.go\npackage b\n\nfunc  B() {}\n"
	if err := os.WriteFile(filepath.Join(dir, "paths.tmpl"), []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}

	outs, err := generate(filepath.Join(dir, "paths.tmpl"))
	if err != nil {
		t.Fatal(err)
	}

	if len(outs) != 2 || outs[0].path != "paths_gen.go" || outs[1].path != "b/b_gen.go" {
		t.Fatalf("outputs %+v, want paths_gen.go and b/b_gen.go", outs)
	}

	if want := header + "package b\n\nfunc B() {}\n"; string(outs[1].src) != want {
		t.Fatalf("b/b_gen.go is %q, want %q", outs[1].src, want)
	}

	if bytes.Contains(outs[0].src, []byte("func B")) {
		t.Fatalf("paths_gen.go holds the second file's code:\n%s", outs[0].src)
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
