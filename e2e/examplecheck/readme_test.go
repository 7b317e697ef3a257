package examplecheck

import (
	"fmt"
	"go/version"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

func readme(t *testing.T) string {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}

	return string(raw)
}

// yamlBlockAfter returns the first ```yaml block after the line containing marker.
func yamlBlockAfter(t *testing.T, doc, marker string) string {
	t.Helper()

	i := strings.Index(doc, marker)
	if i < 0 {
		t.Fatalf("README has no %q", marker)
	}

	start := strings.Index(doc[i:], "```yaml\n")
	if start < 0 {
		t.Fatalf("README: no yaml block after %q", marker)
	}

	body := doc[i+start+len("```yaml\n"):]
	end := strings.Index(body, "```\n")

	return body[:end]
}

// TestReadmeDynamicYAMLIsTheFile: the snippet README calls the repository's
// dynamic.yml is that file, byte for byte.
func TestReadmeDynamicYAMLIsTheFile(t *testing.T) {
	file, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "dynamic.yml"))
	if err != nil {
		t.Fatal(err)
	}

	if got := yamlBlockAfter(t, readme(t), "the repository's `dynamic.yml` as it is"); got != string(file) {
		t.Fatalf("README's dynamic.yml snippet differs from dynamic.yml:\n%s", got)
	}
}

// TestReadmeGoVersion: the Go version README asks for is the highest that a
// module `make test` builds declares.
func TestReadmeGoVersion(t *testing.T) {
	m := regexp.MustCompile(`Go \(([0-9.]+) or newer\)`).FindStringSubmatch(readme(t))
	if m == nil {
		t.Fatal("README does not say which Go version the commands need")
	}

	need := "go1.0"

	err := filepath.WalkDir(harness.RepoRoot(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if d.IsDir() && (d.Name() == ".git" || d.Name() == "vendor" || d.Name() == ".cache") {
			return filepath.SkipDir
		}

		if d.Name() != "go.mod" {
			return nil
		}

		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}

		f, err := modfile.ParseLax(p, raw, nil)
		if err != nil {
			return err
		}

		if f.Go != nil && version.Compare("go"+f.Go.Version, need) > 0 {
			need = "go" + f.Go.Version
		}

		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	if want := strings.TrimPrefix(version.Lang(need), "go"); m[1] != want {
		t.Fatalf("README asks for Go %s; the modules need %s", m[1], want)
	}
}

// normalise lower-cases keys (Traefik matches them case-insensitively),
// writes scalars as strings (as the file provider hands them over) and an
// absent list as an empty one.
func normalise(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		out := map[string]interface{}{}
		for k, x := range t {
			out[strings.ToLower(k)] = normalise(x)
		}

		return out
	case []interface{}:
		out := []interface{}{}
		for _, x := range t {
			out = append(out, normalise(x))
		}

		return out
	case nil:
		return []interface{}{}
	default:
		return fmt.Sprint(t)
	}
}

// TestLicense: the repository carries the Apache License 2.0 and README says so.
func TestLicense(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}

	text := strings.Join(strings.Fields(string(raw)), " ")
	if !strings.HasPrefix(text, "Apache License Version 2.0, January 2004") || !strings.Contains(text, "END OF TERMS AND CONDITIONS") {
		t.Fatal("LICENSE is not the Apache License 2.0")
	}

	if !strings.Contains(readme(t), "## License\n\nApache License 2.0 ([LICENSE](LICENSE))") {
		t.Fatal("README does not name the licence")
	}
}

// TestReadmeFitsInThreeHundredLines: README is the first screen and the
// reference; detail goes to docs/.
func TestReadmeFitsInThreeHundredLines(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}

	if n := strings.Count(string(raw), "\n"); n > 300 {
		t.Errorf("README.md has %d lines; at most 300: move detail to docs/", n)
	}
}
