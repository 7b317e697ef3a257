package yaegibench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// namedOnTheRequestPath are the types of the plugin's packages that another
// package's request path names in a function body, qualified (a local
// variable, a literal, a make): rule.Layer in the root's fast paths,
// counter.Entry in memstore's new windows, redisstore.SyncCounter in the
// synced path. A type joins the list when a request path starts naming it.
var namedOnTheRequestPath = []string{
	"rule.Layer", "rule.Charge", "rule.Tally",
	"counter.Entry",
	"redisstore.SyncCounter",
	"memstore.BlockedKey",
	"events.RedisEvent",
}

// TestTypesTheRequestPathNamesCostNothingUnderYaegi: under Yaegi v0.16.1 a
// function that names another package's type in its body (var x *rule.Layer)
// allocates once more per call for each such name when Yaegi met a reference
// to the type (a signature, a field) before its declaration, reading the
// package's files by name and each file's declarations in order; a type
// declared before anything names it costs nothing (doc.go: qualified names).
// Each type the request path names must cost nothing.
func TestTypesTheRequestPathNamesCostNothingUnderYaegi(t *testing.T) {
	imports := map[string]bool{}
	src := "func Base() int { var x *int; _ = x; return 0 }\n"
	for i, name := range namedOnTheRequestPath {
		imports[strings.Split(name, ".")[0]] = true
		src += "func Use" + string(rune('A'+i)) + "() int { var x *" + name + "; _ = x; return 0 }\n"
	}

	head := "package probe\n\nimport (\n"
	for pkg := range imports {
		head += "\t\"" + harness.ModuleName + "/" + pkg + "\"\n"
	}

	i := probeInterpreter(t, head+")\n\n"+src)

	allocs := func(fn string) float64 {
		v, err := i.Eval("probe." + fn)
		if err != nil {
			t.Fatal(err)
		}

		return testing.AllocsPerRun(100, func() { v.Call(nil) })
	}

	base := allocs("Base")
	for k, name := range namedOnTheRequestPath {
		if extra := allocs("Use"+string(rune('A'+k))) - base; extra != 0 {
			t.Errorf("var x *%s costs %v allocation per call more than var x *int: Yaegi meets a reference to %s before its declaration; declare it before anything of its package names it, its files taken by name", name, extra, name)
		}
	}
}

// probeInterpreter is Yaegi as Traefik runs it, with the plugin's packages
// and a package probe of source src imported.
func probeInterpreter(t *testing.T, src string) *interp.Interpreter {
	t.Helper()

	gopath := t.TempDir()
	if err := harness.CopyPlugin(gopath); err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(gopath, "src", "probe")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(filepath.Join(dir, "probe.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}

	i := interp.New(interp.Options{GoPath: gopath})
	if err := i.Use(stdlib.Symbols); err != nil {
		t.Fatal(err)
	}

	if _, err := i.Eval(`import "probe"`); err != nil {
		t.Fatal(err)
	}

	return i
}
