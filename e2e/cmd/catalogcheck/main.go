// Command catalogcheck runs on the repository the checks the Traefik plugin
// catalog runs before it lists a plugin (`make catalog-check`):
//
//   - .traefik.yml has type, import, displayName, summary and testData;
//   - import equals the module path in go.mod;
//   - go.mod requires neither Traefik nor Yaegi;
//   - vendor/ is what `go mod vendor` makes of go.mod (the catalog loads
//     dependencies from vendor/ only);
//   - the module as the Go module proxy zips it (nested modules such as e2e/
//     left out) loads in Traefik's own Yaegi loader, New accepts testData
//     decoded the way the file provider decodes it (every scalar a string)
//     and the middleware answers a request, all within 10 seconds.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/traefik/traefik/v3/pkg/plugins"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
	"gopkg.in/yaml.v3"
)

func main() {
	root := flag.String("root", "..", "the plugin's repository root")
	timeout := flag.Duration("timeout", 10*time.Second, "time allowed to load the plugin, build it from testData and answer a request")
	flag.Parse()

	if err := run(*root, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "catalog-check:", err)
		os.Exit(1)
	}

	fmt.Println("catalog-check: ok")
}

// manifest is .traefik.yml.
type manifest struct {
	DisplayName string                 `yaml:"displayName"`
	Type        string                 `yaml:"type"`
	Import      string                 `yaml:"import"`
	Summary     string                 `yaml:"summary"`
	TestData    map[string]interface{} `yaml:"testData"`
}

func run(root string, timeout time.Duration) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}

	m, err := readManifest(root)
	if err != nil {
		return err
	}

	modPath, err := checkGoMod(root, m.Import)
	if err != nil {
		return err
	}

	if err := checkVendor(root); err != nil {
		return err
	}

	work, err := os.MkdirTemp("", "tierlimit-catalogcheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	if err := unpackAsProxy(root, modPath, work); err != nil {
		return err
	}

	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	defer func() { _ = os.Chdir(wd) }()

	// Traefik reads local plugins from ./plugins-local relative to its working directory.
	if err := os.Chdir(work); err != nil {
		return err
	}

	return loadAndServe(m, timeout)
}

func readManifest(root string) (manifest, error) {
	var m manifest

	raw, err := os.ReadFile(filepath.Join(root, ".traefik.yml"))
	if err != nil {
		return m, fmt.Errorf("reading the manifest: %w", err)
	}

	if err := yaml.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("reading .traefik.yml: %w", err)
	}

	for _, f := range []struct{ name, value string }{
		{"type", m.Type}, {"import", m.Import}, {"displayName", m.DisplayName}, {"summary", m.Summary},
	} {
		if strings.TrimSpace(f.value) == "" {
			return m, fmt.Errorf(".traefik.yml: %s is missing", f.name)
		}
	}

	if m.Type != "middleware" {
		return m, fmt.Errorf(".traefik.yml: type = %q: want middleware", m.Type)
	}

	if len(m.TestData) == 0 {
		return m, errors.New(".traefik.yml: testData is missing")
	}

	return m, nil
}

func checkGoMod(root, importPath string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("reading go.mod: %w", err)
	}

	f, err := modfile.Parse("go.mod", raw, nil)
	if err != nil {
		return "", fmt.Errorf("reading go.mod: %w", err)
	}

	if f.Module == nil {
		return "", errors.New("go.mod: no module line")
	}

	if importPath != f.Module.Mod.Path {
		return "", fmt.Errorf(".traefik.yml: import = %q: want the module path %q of go.mod", importPath, f.Module.Mod.Path)
	}

	for _, r := range f.Require {
		if p := r.Mod.Path; p == "github.com/traefik/yaegi" || p == "github.com/traefik/traefik" || strings.HasPrefix(p, "github.com/traefik/traefik/") {
			return "", fmt.Errorf("go.mod requires %s: the catalog refuses plugins that require Traefik or Yaegi; move that code into a nested module", p)
		}
	}

	return f.Module.Mod.Path, nil
}

// checkVendor compares vendor/ with what `go mod vendor` writes for go.mod.
func checkVendor(root string) error {
	want, err := os.MkdirTemp("", "tierlimit-vendor-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(want)

	out := filepath.Join(want, "vendor")

	cmd := exec.Command("go", "mod", "vendor", "-o", out)
	cmd.Dir = root

	var stderr bytes.Buffer
	cmd.Stderr = &stderr

	if err := cmd.Run(); err != nil && !strings.Contains(stderr.String(), "no dependencies to vendor") {
		return fmt.Errorf("running go mod vendor: %w: %s", err, stderr.String())
	}

	got, err := tree(filepath.Join(root, "vendor"))
	if err != nil {
		return err
	}

	exp, err := tree(out)
	if err != nil {
		return err
	}

	for p, b := range exp {
		if g, ok := got[p]; !ok || !bytes.Equal(g, b) {
			return fmt.Errorf("vendor/%s is missing or differs from go.mod: run go mod vendor", p)
		}
	}

	for p := range got {
		if _, ok := exp[p]; !ok {
			return fmt.Errorf("vendor/%s is not in go.mod's dependencies: run go mod vendor", p)
		}
	}

	return nil
}

// tree reads every file under dir (none if dir does not exist).
func tree(dir string) (map[string][]byte, error) {
	files := map[string][]byte{}

	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == dir {
			return filepath.SkipDir
		}

		if err != nil || d.IsDir() {
			return err
		}

		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}

		rel, _ := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)] = b

		return nil
	})

	return files, err
}

// unpackAsProxy zips root as the module proxy serves a module (nested modules,
// VCS directories and irregular files left out) and unzips it, as Traefik's
// plugin manager does, into work/plugins-local/src/<module>.
func unpackAsProxy(root, modPath, work string) error {
	v := module.Version{Path: modPath, Version: "v0.0.0"}
	zipFile := filepath.Join(work, "module.zip")

	f, err := os.Create(zipFile)
	if err != nil {
		return err
	}

	if err := modzip.CreateFromDir(f, v, root); err != nil {
		f.Close()
		return fmt.Errorf("zipping the module as the Go proxy would: %w", err)
	}

	if err := f.Close(); err != nil {
		return err
	}

	dest := filepath.Join(work, "plugins-local", "src", filepath.FromSlash(modPath))
	if err := modzip.Unzip(dest, v, zipFile); err != nil {
		return fmt.Errorf("unzipping the module: %w", err)
	}

	return os.Remove(zipFile)
}

// loadAndServe loads the plugin from ./plugins-local with Traefik's loader,
// builds it from testData and sends it one request, within timeout.
func loadAndServe(m manifest, timeout time.Duration) error {
	// The catalog runs the plugin without the environment's secrets.
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if up := strings.ToUpper(name); strings.Contains(up, "TOKEN") || strings.Contains(up, "SECRET") ||
			strings.Contains(up, "PASSWORD") || strings.Contains(up, "KEY") {
			_ = os.Unsetenv(name)
		}
	}

	config, _ := asFileProvider(m.TestData).(map[string]interface{})

	done := make(chan error, 1)

	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("loading the plugin panicked: %v", r)
			}
		}()

		done <- buildAndServe(m.Import, config)
	}()

	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("the plugin did not load, build from testData and answer a request within %s", timeout)
	}
}

func buildAndServe(modPath string, config map[string]interface{}) error {
	b, err := plugins.NewBuilder(nil, nil, map[string]plugins.LocalDescriptor{"catalog": {ModuleName: modPath}})
	if err != nil {
		return fmt.Errorf("loading the plugin with Traefik's Yaegi loader: %w", err)
	}

	ctor, err := b.Build("catalog", config, "catalog@file")
	if err != nil {
		return fmt.Errorf("building the plugin from testData: %w", err)
	}

	reached := false
	next := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		reached = true
		rw.WriteHeader(http.StatusOK)
	})

	h, err := ctor(context.Background(), next)
	if err != nil {
		return fmt.Errorf("calling New with testData: %w", err)
	}

	req := httptest.NewRequest(http.MethodGet, "http://catalog.example/", nil)
	req.RemoteAddr = "192.0.2.10:40000"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	if !reached || rec.Code != http.StatusOK {
		return fmt.Errorf("one request with testData: status %d, next handler reached: %t", rec.Code, reached)
	}

	return nil
}

// asFileProvider turns decoded YAML into what Traefik's file provider hands a
// plugin: maps and lists as they are, every scalar a string.
func asFileProvider(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		out := make(map[string]interface{}, len(t))
		for k, x := range t {
			out[k] = asFileProvider(x)
		}

		return out
	case []interface{}:
		out := make([]interface{}, len(t))
		for i, x := range t {
			out[i] = asFileProvider(x)
		}

		return out
	case nil:
		return ""
	default:
		return fmt.Sprint(t)
	}
}
