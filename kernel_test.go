package tierlimit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// kernelMark opens a kernel: a block of the decision that the fast path
// writes out instead of calling (doc.go: kernels). An optional "(a as b)"
// names a substitution that turns this copy into the others.
var kernelMark = regexp.MustCompile(`^// kernel ([a-z-]+)(?: \((\S+) as (\S+)\))?$`)

// TestKernelsAreIdentical fails when two copies of a kernel drift: every
// "// kernel <name>" block must appear at least twice in the package's
// non-test files and read the same, whitespace aside, after its declared
// substitution. Each copy must also parse as Go statements.
func TestKernelsAreIdentical(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}

	copies := map[string][]string{}
	where := map[string][]string{}

	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}

		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}

		for name, body := range kernels(t, f, string(src)) {
			copies[name] = append(copies[name], body...)
			for range body {
				where[name] = append(where[name], f)
			}
		}
	}

	names := make([]string, 0, len(copies))
	for name := range copies {
		names = append(names, name)
	}

	sort.Strings(names)

	for _, want := range []string{"cached-refusal", "client-ip", "credential-header", "fixed-charge", "headers", "pass-credentialed"} {
		if len(copies[want]) < 2 {
			t.Errorf("kernel %s: %d copies (%v), want at least 2", want, len(copies[want]), where[want])
		}
	}

	for _, name := range names {
		for i, c := range copies[name][1:] {
			if c != copies[name][0] {
				t.Errorf("kernel %s drifted: %s and %s differ:\n%s\n---\n%s", name, where[name][0], where[name][i+1], copies[name][0], c)
			}
		}
	}
}

// kernels returns the normalized kernel blocks of one file by name.
func kernels(t *testing.T, file, src string) map[string][]string {
	t.Helper()

	out := map[string][]string{}
	lines := strings.Split(src, "\n")

	for i := 0; i < len(lines); i++ {
		m := kernelMark.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}

		var body []string

		j := i + 1
		for ; j < len(lines) && strings.TrimSpace(lines[j]) != "// end kernel"; j++ {
			if l := strings.Join(strings.Fields(lines[j]), " "); l != "" {
				body = append(body, l)
			}
		}

		if j == len(lines) {
			t.Fatalf("%s:%d: kernel %s has no // end kernel", file, i+1, m[1])
		}

		text := strings.Join(body, "\n")
		if m[2] != "" {
			text = strings.ReplaceAll(text, m[2], m[3])
		}

		// The block must be statements on its own; parse it inside a function.
		if _, err := parser.ParseFile(token.NewFileSet(), file, "package k\nfunc _() {\n"+text+"\n}\n", 0); err != nil {
			t.Fatalf("%s:%d: kernel %s is not a block of statements: %v", file, i+1, m[1], err)
		}

		out[m[1]] = append(out[m[1]], text)
		i = j
	}

	return out
}

// requestPathFiles hold the functions that serve requests (the status
// endpoint and construction aside).
var requestPathFiles = []string{
	"plugin.go", "fast.go", "general.go", "layer.go", "response.go", "window.go", "sliding.go",
	"tokenbucket.go", "redisstore.go", "clientip.go", "chain.go", "assetpath.go", "invalidcred.go",
	"principal.go", "exempt.go", "path.go", "redisfast.go",
}

// TestRequestPathFunctionsAreShort: no function on the request path is longer
// than 80 lines, so that each can be read whole.
func TestRequestPathFunctionsAreShort(t *testing.T) {
	fset := token.NewFileSet()

	for _, name := range requestPathFiles {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}

		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}

			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > 80 {
				t.Errorf("%s: %s is %d lines long, over 80", name, fd.Name.Name, n)
			}
		}
	}
}
