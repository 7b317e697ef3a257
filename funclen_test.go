package tierlimit

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxFuncLines bounds a hand-written runtime function, in lines from its
// func keyword to its closing brace (doc comment excluded): a function
// longer than that does more than one thing.
const maxFuncLines = 60

// maxGeneratedFuncLines bounds a generated one (paths.tmpl's snippets
// written out, doc.go: generated paths), longer since it writes out what a
// hand-written function would call. A path that outgrows it splits along
// its rare branches (doc.go: frames), where a call costs only the requests
// that take them.
const maxGeneratedFuncLines = 80

// TestNoLongRuntimeFunctions parses every non-test Go file of the plugin's
// module (the root package and its sub-packages; nested modules such as e2e/
// are not runtime code) and fails naming each function longer than
// maxFuncLines, or maxGeneratedFuncLines in a generated file.
func TestNoLongRuntimeFunctions(t *testing.T) {
	lengths, err := runtimeFuncLengths(".")
	if err != nil {
		t.Fatal(err)
	}

	if len(lengths) == 0 {
		t.Fatal("no runtime function found")
	}

	var names []string
	for name := range lengths {
		names = append(names, name)
	}

	sort.Strings(names)

	for _, name := range names {
		bar := maxFuncLines
		if strings.HasSuffix(strings.Fields(name)[0], "_gen.go") {
			bar = maxGeneratedFuncLines
		}

		if n := lengths[name]; n > bar {
			t.Errorf("%s: %d lines, longer than %d: split it into functions with one concern each", name, n, bar)
		}
	}
}

// runtimeFuncLengths returns the length, in lines from func to the closing
// brace, of every function declared in a non-test Go file under root,
// skipping directories that are not the module's packages.
func runtimeFuncLengths(root string) (map[string]int, error) {
	lengths := map[string]int{}
	fset := token.NewFileSet()

	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if d.IsDir() {
			if path != root && skipDir(path, d.Name()) {
				return filepath.SkipDir
			}

			return nil
		}

		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}

		return addFuncLengths(fset, path, lengths)
	})

	return lengths, err
}

// skipDir reports whether a directory holds no package of the module:
// hidden, vendored, test data, or another module.
func skipDir(path, name string) bool {
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "vendor" || name == "testdata" {
		return true
	}

	_, err := os.Stat(filepath.Join(path, "go.mod"))

	return err == nil
}

func addFuncLengths(fset *token.FileSet, path string, lengths map[string]int) error {
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		return err
	}

	if ast.IsGenerated(f) != strings.HasSuffix(path, "_gen.go") {
		return fmt.Errorf("%s: a generated file is named *_gen.go, and only a generated file", path)
	}

	file := filepath.ToSlash(path)

	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}

		n := fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Type.Func).Line + 1

		lengths[file+" "+funcName(fn)] = n
	}

	return nil
}

// funcName is Name, or Recv.Name for a method (the receiver's type without
// its pointer or type parameters).
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}

	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}

	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}

	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}

	return fn.Name.Name
}

// The root package holds what no sub-package owns (doc.go, CONTRIBUTING.md):
// maxRootLines bounds its hand-written runtime lines (its non-test files,
// the generated ones aside), and maxRootAliases its type aliases, each one
// a name the request path needs unqualified (doc.go: qualified names);
// maxRootTestFiles its test files: the root tests the HTTP side, each
// package's own tests sit beside it.
const (
	maxRootLines     = 3000
	maxRootAliases   = 5
	maxRootTestFiles = 25
)

// TestRootHoldsWhatNoPackageOwns counts the root package's hand-written
// runtime lines, as wc -l does, and its type aliases: code that grows past
// the bar goes to the package of its concern.
func TestRootHoldsWhatNoPackageOwns(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}

	lines, tests := 0, 0
	var aliases []string
	fset := token.NewFileSet()

	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			tests++
		}

		if strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, "_gen.go") {
			continue
		}

		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}

		lines += strings.Count(string(src), "\n")

		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			t.Fatal(err)
		}

		for _, decl := range f.Decls {
			if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, spec := range g.Specs {
					if ts, ok := spec.(*ast.TypeSpec); ok && ts.Assign.IsValid() {
						aliases = append(aliases, path+" "+ts.Name.Name)
					}
				}
			}
		}
	}

	if lines > maxRootLines {
		t.Errorf("the root package has %d hand-written lines, more than %d: move what has a package of its own there (CONTRIBUTING.md)", lines, maxRootLines)
	}

	if tests > maxRootTestFiles {
		t.Errorf("the root package has %d test files, more than %d: a package's own tests go beside it, a root test beside the file of its behaviour", tests, maxRootTestFiles)
	}

	if len(aliases) > maxRootAliases {
		t.Errorf("the root package has %d type aliases, more than %d: %s", len(aliases), maxRootAliases, strings.Join(aliases, ", "))
	}
}
