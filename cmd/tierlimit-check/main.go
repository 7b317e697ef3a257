// Command tierlimit-check checks the tierlimit middlewares of Traefik dynamic
// configuration files (YAML or TOML, as the file provider reads them), of
// Kubernetes manifests (Middleware objects of traefik.io/v1alpha1, as the CRD
// provider reads them) and of Docker labels (as the Docker provider reads
// them) before a reload, so that a typo does not take a router down.
//
// Each middleware is built the way Traefik builds it: the plugin's source is
// loaded by Traefik's own loader (pkg/plugins: Yaegi, mapstructure with weak
// typing and the comma hook) and New is called with the provider's
// configuration map and the middleware's qualified name. One line per
// middleware, `<file>: <name>: ok`, or one per error it finds,
// `<file>: <name>: <error>`, in the configuration's names (problems.go).
//
// Exit status: 0 when every middleware builds, 1 when one does not, 2 when a
// file cannot be read or parsed or the plugin cannot be loaded (2 wins over 1).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

const (
	exitOK      = 0
	exitInvalid = 1
	exitFiles   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: tierlimit-check [-plugin tierlimit] [-src DIR] FILE|DIR...

Builds every tierlimit middleware of Traefik dynamic configuration files (YAML, TOML),
Kubernetes manifests (traefik.io/v1alpha1 Middleware objects) and Docker labels (a Compose
file's services.<name>.labels, or a file of labels alone) as Traefik would; a directory is
walked for .yml, .yaml and .toml files. Prints "<file>: <middleware>: ok", or each error
it finds (Traefik logs the first). urn:k8s:secret values are checked as written, not resolved.
Exit status: 0 all ok, 1 a middleware has an error, 2 a file cannot be read or parsed.

`

// run is the command: args without the program name; the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("tierlimit-check", flag.ContinueOnError)
	flags.SetOutput(stderr)
	aliases := flags.String("plugin", "tierlimit", "the plugin's alias in Traefik's static configuration (experimental.plugins.<alias> or localPlugins.<alias>); several separated by commas")
	src := flags.String("src", defaultSource(), "the plugin's source: the repository root, with .traefik.yml")
	flags.Usage = func() {
		fmt.Fprint(stderr, usage)
		flags.PrintDefaults()
	}

	if err := flags.Parse(args); err != nil {
		return exitFiles
	}

	if flags.NArg() == 0 {
		flags.Usage()
		return exitFiles
	}

	c := &check{aliases: splitAliases(*aliases), src: *src, out: stdout}
	for _, f := range expand(flags.Args(), c) {
		c.file(f)
	}

	c.close()

	return c.status
}

// splitAliases is the -plugin flag as a list.
func splitAliases(s string) []string {
	var out []string

	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}

	return out
}

// defaultSource is the repository this command was built from: two
// directories above this file (empty when built with -trimpath).
func defaultSource() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return ""
	}

	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// expand lists the files to check: each file argument, and the .yml, .yaml
// and .toml files under each directory argument, in lexical order. An
// argument it cannot read is reported and left out.
func expand(args []string, c *check) []string {
	var files []string

	for _, arg := range args {
		err := filepath.WalkDir(arg, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}

			if !d.IsDir() && (p == arg || configExt(p)) {
				files = append(files, p)
			}

			return nil
		})
		if err != nil {
			fmt.Fprintf(c.out, "%s: %v\n", arg, err)
			c.fail(exitFiles)
		}
	}

	return files
}

// configExt: a file the command reads in a directory (and accepts as an argument).
func configExt(p string) bool {
	switch strings.ToLower(filepath.Ext(p)) {
	case ".yml", ".yaml", ".toml":
		return true
	}

	return false
}
