package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInlineWritesLimitsExpression: a limit function's returned expression,
// its parameters replaced by the arguments, an argument that is not an
// operand in parentheses.
func TestInlineWritesLimitsExpression(t *testing.T) {
	fns, err := readLimit(filepath.Join("..", "..", "..", "limit"))
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"Fits", "w.Count", "cost", "l.Points"}, "w.Count+cost <= l.Points"},
		{[]string{"Fits", "a + b", "1", "p[i]"}, "a+b+1 <= p[i]"},
		{[]string{"Fits", "x", "a - b", "p"}, "x+(a-b) <= p"},
		{[]string{"Left", "a + b", "p"}, "p - (a + b)"},
		{[]string{"FewerLeft", "p - c", "left"}, "p-c < left"},
	} {
		got, err := fns.inline(c.args[0], c.args[1:]...)
		if err != nil || got != c.want {
			t.Errorf("inline %q = %q, %v; want %q", c.args, got, err, c.want)
		}
	}

	if _, err := fns.inline("Fits", "a", "b"); err == nil {
		t.Error("inline Fits with two arguments: no error")
	}

	if _, err := fns.inline("NoSuchFunction"); err == nil {
		t.Error("inline of a function limit lacks: no error")
	}
}

// TestInlineTakesOneReturnOnly: a function with more than a return of an
// expression is not written out (its statements would be lost).
func TestInlineTakesOneReturnOnly(t *testing.T) {
	dir := t.TempDir()
	src := "package limit\n\nfunc Two(a int64) int64 {\n\tb := a\n\treturn b\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "two.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}

	fns, err := readLimit(dir)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := fns.inline("Two", "x"); err == nil || !strings.Contains(err.Error(), "one return") {
		t.Fatalf("inline Two: %v, want an error about one return", err)
	}
}
