package main

import (
	"archive/zip"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

const fixtureManifest = `displayName: Fixture
type: middleware
import: example.com/fixture
summary: a plugin for the catalog check's own tests
testData:
  points: 5
`

const fixturePlugin = `package fixture

import (
	"context"
	"errors"
	"net/http"
)

type Config struct{ Points int }

func CreateConfig() *Config { return &Config{} }

func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	if config.Points != 5 {
		return nil, errors.New("points is not 5")
	}
	BODY
	return next, nil
}
`

// fixture writes a plugin repository into a temporary directory; edit
// changes one of its files before the check.
func fixture(t *testing.T, edit map[string]string) string {
	t.Helper()

	dir := t.TempDir()
	files := map[string]string{
		".traefik.yml": fixtureManifest,
		"go.mod":       "module example.com/fixture\n\ngo 1.22\n",
		"fixture.go":   strings.Replace(fixturePlugin, "BODY", "", 1),
		"e2e/go.mod":   "module example.com/fixture/e2e\n\ngo 1.22\n",
		"e2e/x.go":     "package e2e\n\nthis does not compile\n",
	}

	for name, content := range edit {
		files[name] = content
	}

	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}

		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	return dir
}

func TestCatalogCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit map[string]string
		want string // "" = passes
	}{
		{"a plugin that passes", nil, ""},
		{"no displayName", map[string]string{".traefik.yml": strings.Replace(fixtureManifest, "displayName: Fixture\n", "", 1)}, "displayName is missing"},
		{"no summary", map[string]string{".traefik.yml": strings.Replace(fixtureManifest, "summary:", "sumary:", 1)}, "summary is missing"},
		{"no testData", map[string]string{".traefik.yml": strings.Replace(fixtureManifest, "testData:\n  points: 5\n", "", 1)}, "testData is missing"},
		{"import is not the module path", map[string]string{".traefik.yml": strings.Replace(fixtureManifest, "import: example.com/fixture", "import: example.com/other", 1)}, `import = "example.com/other"`},
		{"go.mod requires Traefik", map[string]string{"go.mod": "module example.com/fixture\n\ngo 1.22\n\nrequire github.com/traefik/traefik/v3 v3.6.12\n"}, "requires github.com/traefik/traefik/v3"},
		{"go.mod requires Yaegi", map[string]string{"go.mod": "module example.com/fixture\n\ngo 1.22\n\nrequire github.com/traefik/yaegi v0.16.1\n"}, "requires github.com/traefik/yaegi"},
		{"vendor/ without dependencies", map[string]string{"vendor/modules.txt": "# example.com/dep v1.0.0\n"}, "vendor/modules.txt is not in go.mod's dependencies"},
		{"New refuses testData", map[string]string{".traefik.yml": strings.Replace(fixtureManifest, "points: 5", "points: 6", 1)}, "points is not 5"},
		{"the plugin does not compile under Yaegi", map[string]string{"fixture.go": strings.Replace(fixturePlugin, "BODY", "undefinedCall()", 1)}, "loading the plugin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(t.TempDir())

			err := run(fixture(t, tc.edit), time.Minute)

			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want no error, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want an error with %q, got %v", tc.want, err)
			}
		})
	}
}

// TestCatalogCheckDeadline: a New that never returns fails the check.
func TestCatalogCheckDeadline(t *testing.T) {
	t.Chdir(t.TempDir())

	dir := fixture(t, map[string]string{"fixture.go": strings.Replace(fixturePlugin, "BODY", "select {}", 1)})

	if err := run(dir, 2*time.Second); err == nil || !strings.Contains(err.Error(), "within 2s") {
		t.Fatalf("want the deadline's error, got %v", err)
	}
}

// TestRepositoryZipLeavesOutNestedModules: the zip the plugin is loaded from
// has the plugin's files and nothing of e2e/.
func TestRepositoryZipLeavesOutNestedModules(t *testing.T) {
	var buf bytes.Buffer

	v := module.Version{Path: harness.ModuleName, Version: "v0.0.0"}
	if err := modzip.CreateFromDir(&buf, v, harness.RepoRoot()); err != nil {
		t.Fatal(err)
	}

	r, err := zip.NewReader(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}

	names := map[string]bool{}
	for _, f := range r.File {
		name := strings.TrimPrefix(f.Name, v.Path+"@"+v.Version+"/")
		names[name] = true

		if strings.HasPrefix(name, "e2e/") {
			t.Errorf("the module zip holds %s", name)
		}
	}

	for _, want := range []string{".traefik.yml", "go.mod", "plugin.go", "redisresp/conn.go"} {
		if !names[want] {
			t.Errorf("the module zip lacks %s", want)
		}
	}
}
