package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

// limitFuncs are the functions of the plugin's limit package whose body is
// one return of an expression: the arithmetic the generated paths write
// out, so that no hand-written line of theirs restates a comparison of
// limit (the inline template function). A directory without limit (a
// test's template) has none.
type limitFuncs map[string]*ast.FuncDecl

// readLimit parses the non-test files of dir, the limit package.
func readLimit(dir string) (limitFuncs, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}

	fns := limitFuncs{}
	fset := token.NewFileSet()

	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}

		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}

		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", f, err)
		}

		for _, d := range file.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				fns[fd.Name.Name] = fd
			}
		}
	}

	return fns, nil
}

// inline is the body of limit's function name, one returned expression,
// with each parameter replaced by the Go expression given for it, in the
// parameters' order: {{inline "Fits" "w.Count" "cost" "l.Points"}} is
// w.Count+cost <= l.Points. An argument is put in parentheses where its
// operators would otherwise bind to the function's (an operand of a
// tighter or equal operator), so that the expression means what the
// function computes.
func (fns limitFuncs) inline(name string, argv ...string) (string, error) {
	fd := fns[name]
	if fd == nil {
		return "", fmt.Errorf("inline: limit has no function %s", name)
	}

	if len(fd.Body.List) != 1 {
		return "", fmt.Errorf("inline: limit.%s is not one return of an expression", name)
	}

	ret, ok := fd.Body.List[0].(*ast.ReturnStmt)
	if !ok || len(ret.Results) != 1 {
		return "", fmt.Errorf("inline: limit.%s is not one return of an expression", name)
	}

	subst, err := parameters(fd, name, argv)
	if err != nil {
		return "", err
	}

	expr := replace(ret.Results[0], subst, 0, false)
	bad := false
	ast.Inspect(expr, func(n ast.Node) bool {
		_, isBad := n.(*ast.BadExpr)
		bad = bad || isBad

		return true
	})

	if bad {
		return "", fmt.Errorf("inline: limit.%s's expression has a form inline does not copy", name)
	}

	var buf bytes.Buffer
	if err := printer.Fprint(&buf, token.NewFileSet(), expr); err != nil {
		return "", err
	}

	return buf.String(), nil
}

// parameters maps each of fd's parameters to its argument's expression.
func parameters(fd *ast.FuncDecl, name string, argv []string) (map[string]ast.Expr, error) {
	subst := map[string]ast.Expr{}
	n := 0

	for _, field := range fd.Type.Params.List {
		for _, p := range field.Names {
			if n >= len(argv) {
				return nil, fmt.Errorf("inline: limit.%s takes more than %d arguments", name, len(argv))
			}

			e, err := parser.ParseExpr(argv[n])
			if err != nil {
				return nil, fmt.Errorf("inline: limit.%s's argument %q: %w", name, argv[n], err)
			}

			subst[p.Name] = e
			n++
		}
	}

	if n != len(argv) {
		return nil, fmt.Errorf("inline: limit.%s takes %d arguments, not %d", name, n, len(argv))
	}

	return subst, nil
}

// replace returns a copy of e with each name in subst replaced by its
// expression, in parentheses when it is a binary expression that would not
// stay whole as an operand of an operator of precedence prec (0: none; the
// right operand when right). Only the forms of expressions limit's one-line
// functions use are copied; another becomes a BadExpr, which inline
// reports.
func replace(e ast.Expr, subst map[string]ast.Expr, prec int, right bool) ast.Expr {
	switch x := e.(type) {
	case *ast.Ident:
		r, ok := subst[x.Name]
		if !ok {
			return &ast.Ident{Name: x.Name}
		}

		if b, isBinary := r.(*ast.BinaryExpr); isBinary && (b.Op.Precedence() < prec || right && b.Op.Precedence() == prec) {
			return &ast.ParenExpr{X: r}
		}

		return r
	case *ast.BinaryExpr:
		p := x.Op.Precedence()
		return &ast.BinaryExpr{X: replace(x.X, subst, p, false), Op: x.Op, Y: replace(x.Y, subst, p, true)}
	case *ast.UnaryExpr:
		return &ast.UnaryExpr{Op: x.Op, X: replace(x.X, subst, token.HighestPrec, false)}
	case *ast.ParenExpr:
		return &ast.ParenExpr{X: replace(x.X, subst, 0, false)}
	case *ast.BasicLit:
		return &ast.BasicLit{Kind: x.Kind, Value: x.Value}
	default:
		return &ast.BadExpr{}
	}
}
