package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// TestRuntimeCodeAvoidsYaegiMultiAssignBug: under Yaegi v0.16.1 an assignment
// `a, b = f(x), y` (operator =, several values, one of them a call or a
// conversion) stores only the call's value and leaves the others unchanged,
// and `a, b = nil, nil` panics (reflect: New(nil)); `:=` and `var` are not
// affected. The plugin's runtime code must not use these forms (write one
// assignment per variable).
func TestRuntimeCodeAvoidsYaegiMultiAssignBug(t *testing.T) {
	root := harness.RepoRoot()
	fset := token.NewFileSet()

	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}

		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || rel == "e2e" || rel == "vendor" || rel == "examples") {
				return filepath.SkipDir
			}

			return nil
		}

		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}

		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}

		ast.Inspect(f, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok || as.Tok != token.ASSIGN || len(as.Lhs) < 2 || len(as.Rhs) != len(as.Lhs) {
				return true
			}

			for _, r := range as.Rhs {
				if id, isIdent := r.(*ast.Ident); isIdent && id.Name == "nil" {
					t.Errorf("%s: a multiple assignment of nil, which Yaegi gets wrong", fset.Position(as.Pos()))
					break
				}

				call := false
				ast.Inspect(r, func(m ast.Node) bool {
					if _, isCall := m.(*ast.CallExpr); isCall {
						call = true
					}

					return !call
				})

				if call {
					t.Errorf("%s: a multiple assignment with a call, which Yaegi gets wrong", fset.Position(as.Pos()))
					break
				}
			}

			return true
		})

		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
