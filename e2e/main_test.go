package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/fakeauth"
	"github.com/tierlimit/tierlimit/e2e/harness"
)

func TestMain(m *testing.M) {
	// Build Traefik before any test's timer starts counting.
	if _, err := harness.TraefikBinary(os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	os.Exit(m.Run())
}

// env is one Traefik with the plugin and one backend, stopped at the end of the test.
type env struct {
	t       *testing.T
	traefik *harness.Traefik
	backend string
	auth    string // the ForwardAuth server (fakeauth.Handler)
	client  *http.Client
}

// start runs Traefik with dynamic, in which {{backend}} stands for the backend
// URL and {{auth}} for the ForwardAuth server's.
func start(t *testing.T, dynamic string) *env {
	t.Helper()

	return startWith(t, dynamic, harness.Options{})
}

// startWith is start with more of Traefik's options (Dir and Dynamic are set here).
func startWith(t *testing.T, dynamic string, opts harness.Options) *env {
	t.Helper()

	backend, stop, err := harness.ServeBackend("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(stop)

	auth, stopAuth, err := harness.Serve("127.0.0.1:0", fakeauth.Handler())
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(stopAuth)

	e := &env{t: t, backend: backend, auth: auth, client: &http.Client{Timeout: 10 * time.Second}}

	opts.Dir, opts.Dynamic = t.TempDir(), e.render(dynamic)

	tr, err := harness.Start(opts)
	if err != nil {
		t.Fatal(err)
	}

	e.traefik = tr

	t.Cleanup(func() {
		tr.Stop()

		if t.Failed() {
			full := filepath.Join(os.TempDir(), "tierlimit-e2e-"+strings.ReplaceAll(t.Name(), "/", "_")+".log")
			_ = os.WriteFile(full, []byte(tr.Logs()), 0o644)
			t.Logf("traefik output (all of it in %s):\n%s", full, tail(tr.Logs(), 30))
		}
	})

	return e
}

func (e *env) render(dynamic string) string {
	return strings.NewReplacer("{{backend}}", e.backend, "{{auth}}", e.auth).Replace(dynamic)
}

// waitRouters waits for the routers and fails unless each is enabled.
func (e *env) waitRouters(names ...string) {
	e.t.Helper()

	states, err := e.traefik.WaitRouters(30*time.Second, names...)
	if err != nil {
		e.t.Fatal(err)
	}

	for _, n := range names {
		if s := states[n]; s.Status != "enabled" {
			e.t.Fatalf("router %s is %q: %v", n, s.Status, s.Error)
		}
	}
}

// response is what a test reads of a response.
type response struct {
	code   int
	header http.Header
	body   string
}

// do sends a request; hdr may set X-Forwarded-For to act as a client behind a proxy.
func (e *env) do(method, url string, hdr map[string]string) response {
	e.t.Helper()

	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		e.t.Fatal(err)
	}

	for k, v := range hdr {
		req.Header.Set(k, v)
	}

	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()

	body, _ := io.ReadAll(resp.Body)

	return response{code: resp.StatusCode, header: resp.Header, body: string(body)}
}

func (e *env) get(url string, hdr map[string]string) response {
	e.t.Helper()
	return e.do(http.MethodGet, url, hdr)
}

func from(ip string) map[string]string {
	return map[string]string{"X-Forwarded-For": ip}
}

func tail(s string, lines int) string {
	all := strings.Split(s, "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}

	return strings.Join(all, "\n")
}
