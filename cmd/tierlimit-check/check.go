package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/traefik/traefik/v3/pkg/plugins"
)

// moduleName is the plugin's Go module, as Traefik's static configuration names it.
const moduleName = "github.com/tierlimit/tierlimit"

// secretNote follows "ok" for a middleware whose configuration holds
// urn:k8s:secret references: Traefik's CRD provider replaces them with the
// Secret's value, which the command does not read.
const secretNote = " (urn:k8s:secret values checked as written, not resolved)"

// check holds the run's state: the plugin, loaded at the first middleware,
// and the exit status so far.
type check struct {
	aliases []string
	src     string
	out     io.Writer
	status  int

	builder *plugins.Builder
	loadErr error
	tmp     string
}

// file checks one file's middlewares and prints a line for each.
func (c *check) file(path string) {
	mws, err := readConfig(path, c.aliases)
	if err != nil {
		fmt.Fprintf(c.out, "%s: %s\n", path, oneLine(err))
		c.fail(exitFiles)

		return
	}

	if len(mws) == 0 {
		fmt.Fprintf(c.out, "%s: no %s middleware\n", path, strings.Join(c.aliases, " or "))
		return
	}

	for _, m := range mws {
		problems := []string(nil)
		if m.err != nil {
			problems = []string{oneLine(m.err)}
		} else {
			problems = c.build(m)
		}

		for _, p := range problems {
			fmt.Fprintf(c.out, "%s: %s: %s\n", path, m.name, p)
		}

		if len(problems) > 0 {
			c.fail(exitInvalid)
			continue
		}

		note := ""
		if m.secrets {
			note = secretNote
		}

		fmt.Fprintf(c.out, "%s: %s: ok%s\n", path, m.name, note)
	}
}

// oneLine is an error on one line (mapstructure lists its errors on several).
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// fail raises the exit status (2 wins over 1).
func (c *check) fail(code int) {
	if code > c.status {
		c.status = code
	}
}

// build builds the middleware as Traefik does, and returns every error it
// finds (problems.go); none when it builds.
func (c *check) build(m middleware) []string {
	b, err := c.plugin()
	if err != nil {
		c.fail(exitFiles)
		return []string{oneLine(fmt.Errorf("loading the plugin: %w", err))}
	}

	return c.problems(b, m)
}

// construct calls the constructor that Build returned, as Traefik does:
// it calls New. New's context is cancelled at once, as a reload would.
func (c *check) construct(ctor plugins.Constructor) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	_, err = ctor(ctx, http.NotFoundHandler())

	return err
}

// plugin loads the plugin's source from c.src with Traefik's loader, once.
// The loader reads ./plugins-local/src/<module> from the working directory:
// a temporary directory with a link to the source, for the loading only.
func (c *check) plugin() (*plugins.Builder, error) {
	if c.builder != nil || c.loadErr != nil {
		return c.builder, c.loadErr
	}

	c.builder, c.loadErr = load(c)

	return c.builder, c.loadErr
}

func load(c *check) (*plugins.Builder, error) {
	src, err := filepath.Abs(c.src)
	if err != nil {
		return nil, err
	}

	if _, err := os.Stat(filepath.Join(src, ".traefik.yml")); err != nil {
		return nil, fmt.Errorf("no plugin source at %q (give the repository root with -src): %w", c.src, err)
	}

	c.tmp, err = os.MkdirTemp("", "tierlimit-check-")
	if err != nil {
		return nil, err
	}

	link := filepath.Join(c.tmp, "plugins-local", "src", filepath.FromSlash(moduleName))
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return nil, err
	}

	if err := os.Symlink(src, link); err != nil {
		return nil, err
	}

	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}

	if err := os.Chdir(c.tmp); err != nil {
		return nil, err
	}

	defer os.Chdir(wd) //nolint:errcheck // back where the file arguments are relative to

	descriptors := map[string]plugins.LocalDescriptor{}
	for _, a := range c.aliases {
		descriptors[a] = plugins.LocalDescriptor{ModuleName: moduleName}
	}

	return plugins.NewBuilder(nil, nil, descriptors)
}

// close removes the loader's temporary directory.
func (c *check) close() {
	if c.tmp != "" {
		os.RemoveAll(c.tmp)
	}
}
