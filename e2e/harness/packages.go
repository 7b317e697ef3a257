package harness

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// PluginSubPackages returns the plugin module's sub-packages, as paths
// relative to the repository root (answer, config, redisresp, request...),
// each with its non-test Go files' names, sorted: the directories Traefik's
// Yaegi loader imports from besides the root. Hidden directories, testdata
// and nested modules (e2e/, cmd/tierlimit-check/) are not the plugin's.
func PluginSubPackages() (map[string][]string, error) {
	root := RepoRoot()
	pkgs := map[string][]string{}

	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if d.IsDir() {
			if path == root {
				return nil
			}

			name := d.Name()
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" {
				return filepath.SkipDir
			}

			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}

			return nil
		}

		dir := filepath.Dir(path)
		if dir == root || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}

		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}

		pkgs[filepath.ToSlash(rel)] = append(pkgs[filepath.ToSlash(rel)], d.Name())

		return nil
	})

	for _, files := range pkgs {
		sort.Strings(files)
	}

	return pkgs, err
}
