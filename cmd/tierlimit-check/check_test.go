package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCheck runs the command in process (it loads the plugin from this
// repository, two directories up) and returns what it printed and its exit
// status.
func runCheck(t *testing.T, args ...string) (string, int) {
	t.Helper()

	var out, errOut bytes.Buffer

	code := run(args, &out, &errOut)
	t.Logf("tierlimit-check %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())

	return out.String(), code
}

// wantLines fails unless out is exactly these lines.
func wantLines(t *testing.T, out string, lines ...string) {
	t.Helper()

	if want := strings.Join(lines, "\n") + "\n"; out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

func TestValidFileIsOK(t *testing.T) {
	out, code := runCheck(t, "../../dynamic.yml")

	wantLines(t, out, "../../dynamic.yml: ratelimit@file: ok")

	if code != exitOK {
		t.Errorf("exit %d, want 0", code)
	}
}

func TestUnknownKeyIsNamed(t *testing.T) {
	out, code := runCheck(t, "testdata/unknown-key.yml")

	wantLines(t, out, `testdata/unknown-key.yml: ratelimit@file: configuring ratelimit@file: invalid configuration: unknown field "ip.poinst" (did you mean "ip.points"?)`)

	if code != exitInvalid {
		t.Errorf("exit %d, want 1", code)
	}
}

// Route keys read from the request's body, alone or with other sources,
// and maxRequestBody as a size or a number of bytes.
func TestBodyAndCompositeKeys(t *testing.T) {
	out, code := runCheck(t, "testdata/body-keys.yml")

	wantLines(t, out,
		`testdata/body-keys.yml: emptyPath@file: configuring emptyPath@file: invalid configuration: routes[0].key = "header:X-Api-Key,json:": source 2 "json:": an empty path`,
		`testdata/body-keys.yml: negativeBound@file: configuring negativeBound@file: invalid configuration: routes[0].maxRequestBody = "-1": must be from 1 byte to 1GiB`,
		"testdata/body-keys.yml: perModel@file: ok")

	if code != exitInvalid {
		t.Errorf("exit %d, want 1", code)
	}
}

func TestWrongTypedValues(t *testing.T) {
	out, code := runCheck(t, "testdata/wrong-type.yml")

	// Traefik's decoder (mapstructure, weakly typed) refuses them before New,
	// naming Go's fields ('IP.Points'); the check names the configuration's.
	// The string "5" for an int is fine, as the file provider sends every scalar as a string.
	wantLines(t, out,
		`testdata/wrong-type.yml: dryrun@file: failed to decode configuration: dryRun = "maybe": not true or false`,
		"testdata/wrong-type.yml: good@file: ok",
		`testdata/wrong-type.yml: points@file: failed to decode configuration: ip.points = "five": not a whole number`)

	if code != exitInvalid {
		t.Errorf("exit %d, want 1", code)
	}
}

func TestTOMLFile(t *testing.T) {
	out, code := runCheck(t, "testdata/dynamic.toml")

	wantLines(t, out,
		`testdata/dynamic.toml: broken@file: configuring broken@file: invalid configuration: store = "memcached": must be "memory" or "redis"`,
		"testdata/dynamic.toml: edge@file: ok")

	if code != exitInvalid {
		t.Errorf("exit %d, want 1", code)
	}
}

func TestKubernetesManifests(t *testing.T) {
	out, code := runCheck(t, "testdata/manifests.yaml")

	// Named as the CRD provider names them; JSON numbers decode; the secret
	// reference is checked as the string it is; the forwardAuth middleware and
	// the Secret are not the plugin's.
	wantLines(t, out,
		"testdata/manifests.yaml: web-ratelimit-edge@kubernetescrd: ok"+secretNote,
		`testdata/manifests.yaml: web-ratelimit-principal@kubernetescrd: configuring web-ratelimit-principal@kubernetescrd: invalid configuration: user.duration = "10 minutes": not a duration (examples: "1s", "60s", "500ms", 60)`)

	if code != exitInvalid {
		t.Errorf("exit %d, want 1", code)
	}
}

func TestMalformedSecretReference(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret.yaml")
	write(t, path, `apiVersion: traefik.io/v1alpha1
kind: Middleware
metadata: {name: rl}
spec:
  plugin:
    tierlimit:
      redis: {password: "urn:k8s:secret:redis"}
`)

	out, code := runCheck(t, path)

	// Traefik's CRD provider refuses a reference that is not urn:k8s:secret:<secret>:<key>.
	wantLines(t, out, path+`: default-rl@kubernetescrd: plugin: malformed secret URN "urn:k8s:secret:redis"`)

	if code != exitInvalid {
		t.Errorf("exit %d, want 1", code)
	}
}

func TestDockerLabels(t *testing.T) {
	out, code := runCheck(t, "testdata/compose.yml")

	wantLines(t, out,
		`testdata/compose.yml: admin@docker: configuring admin@docker: invalid configuration: unknown field "ip.point" (did you mean "ip.points"?)`,
		"testdata/compose.yml: edge@docker: ok")

	if code != exitInvalid {
		t.Errorf("exit %d, want 1", code)
	}
}

func TestPluginAlias(t *testing.T) {
	out, code := runCheck(t, "-plugin", "ratelimit", "testdata/alias.yml")
	wantLines(t, out, "testdata/alias.yml: edge@file: ok")

	if code != exitOK {
		t.Errorf("exit %d, want 0", code)
	}

	out, _ = runCheck(t, "testdata/unknown-key.yml", "testdata/alias.yml")
	if !strings.HasSuffix(out, "testdata/alias.yml: other@file: ok\n") || strings.Contains(out, "edge@file") {
		t.Errorf("the default alias is tierlimit:\n%s", out)
	}
}

func TestUnreadableAndUnparsableFiles(t *testing.T) {
	out, code := runCheck(t, "testdata/missing.yml", "testdata/broken.yml", "testdata/unknown-key.yml", "../../dynamic.yml")

	// Every file is checked; 2 wins over 1.
	wantLines(t, out,
		"testdata/missing.yml: lstat testdata/missing.yml: no such file or directory",
		"testdata/broken.yml: yaml: line 2: did not find expected ',' or ']'",
		`testdata/unknown-key.yml: ratelimit@file: configuring ratelimit@file: invalid configuration: unknown field "ip.poinst" (did you mean "ip.points"?)`,
		"../../dynamic.yml: ratelimit@file: ok")

	if code != exitFiles {
		t.Errorf("exit %d, want 2", code)
	}

	out, code = runCheck(t, "testdata/broken.yml", "../../dynamic.yml")
	wantLines(t, out, "testdata/broken.yml: yaml: line 2: did not find expected ',' or ']'", "../../dynamic.yml: ratelimit@file: ok")

	if code != exitFiles {
		t.Errorf("a file that does not parse: exit %d, want 2", code)
	}

	if _, code := runCheck(t); code != exitFiles {
		t.Errorf("no argument: exit %d, want 2", code)
	}

	if out, code := runCheck(t, "-src", t.TempDir(), "../../dynamic.yml"); code != exitFiles || !strings.Contains(out, "no plugin source") {
		t.Errorf("without the plugin's source: exit %d, want 2, and the reason", code)
	}
}

// TestExamples: every example and dynamic.yml hold tierlimit middlewares
// (but the Gateway route and the Helm values) and every one of them builds (make config-check runs the same).
func TestExamples(t *testing.T) {
	out, code := runCheck(t, "../../dynamic.yml", "../../docker-compose.yml", "../../examples")
	if code != exitOK {
		t.Errorf("exit %d, want 0", code)
	}

	files := map[string]bool{}

	// The Gateway API route names a Middleware of chain.yaml and the Helm values hold none.
	without := map[string]bool{
		filepath.FromSlash("../../examples/kubernetes/gateway.yaml"):     true,
		filepath.FromSlash("../../examples/kubernetes/helm-values.yaml"): true,
	}

	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f, ok := strings.CutSuffix(line, ": no tierlimit middleware"); ok && without[f] {
			continue
		}

		if !strings.HasSuffix(line, ": ok") && !strings.HasSuffix(line, ": ok"+secretNote) {
			t.Errorf("not ok: %s", line)
		}

		files[line[:strings.Index(line, ": ")]] = true
	}

	for _, f := range []string{"../../dynamic.yml", "../../docker-compose.yml", "../../examples/file/dynamic.yml",
		"../../examples/docker/labels.yml", "../../examples/kubernetes/chain.yaml", "../../examples/kubernetes/redis-sentinel.yaml"} {
		if !files[filepath.FromSlash(f)] {
			t.Errorf("%s: no middleware checked", f)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()

	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestEveryErrorOfAMiddlewareIsReported: the check reports every error it
// can tell apart, in the configuration's names: both typos of one line, the
// wrong types (all of them, as Traefik's decoding finds them), the unknown
// keys, and the first error of each section New refuses; not the route's
// costFrom "on a route with points 0", which only the wrong type of its
// points makes.
func TestEveryErrorOfAMiddlewareIsReported(t *testing.T) {
	out, code := runCheck(t, "testdata/every-error.yml")

	const f = "testdata/every-error.yml: "
	wantLines(t, out,
		f+`many@file: failed to decode configuration: dryRun = "maybe": not true or false`,
		f+`many@file: failed to decode configuration: routes[0].points = "five": not a whole number`,
		f+`many@file: configuring many@file: invalid configuration: unknown field "routes[1].methodz" (did you mean "routes[1].methods"?)`,
		f+`many@file: configuring many@file: invalid configuration: ipv6PrefixLength = "200": must be between 1 and 128`,
		f+`many@file: configuring many@file: invalid configuration: user.points = "-1": must be >= 0 (0 turns the layer off)`,
		f+`many@file: configuring many@file: invalid configuration: routes[1].paths[0] = "login": must start with "/" and hold no query, fragment or whitespace`,
		f+`many@file: configuring many@file: invalid configuration: plans.pro.points = "-2": must be >= 0 (0 turns the layer off)`,
		f+`typos@file: configuring typos@file: invalid configuration: unknown field "ip.duraton" (did you mean "ip.duration"?)`,
		f+`typos@file: configuring typos@file: invalid configuration: unknown field "ip.point" (did you mean "ip.points"?)`)

	if code != exitInvalid {
		t.Errorf("exit %d, want 1", code)
	}
}
