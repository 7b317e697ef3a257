package sdk

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

func TestMain(m *testing.M) {
	// Build Traefik (into e2e/.cache, from the e2e module) before any test's timer starts counting.
	if _, err := harness.TraefikBinary(os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	os.Exit(m.Run())
}

// env is one Traefik with the plugin, stopped at the end of the test (the e2e
// module's env, with only what these tests use).
type env struct {
	t       *testing.T
	traefik *harness.Traefik
	client  *http.Client
}

// start runs Traefik with the dynamic configuration.
func start(t *testing.T, dynamic string) *env {
	t.Helper()

	tr, err := harness.Start(harness.Options{Dir: t.TempDir(), Dynamic: dynamic})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		tr.Stop()

		if t.Failed() {
			full := filepath.Join(os.TempDir(), "tierlimit-e2e-"+strings.ReplaceAll(t.Name(), "/", "_")+".log")
			_ = os.WriteFile(full, []byte(tr.Logs()), 0o644)
			t.Logf("traefik output (all of it in %s):\n%s", full, tail(tr.Logs(), 30))
		}
	})

	h2c := h2cTransport()
	t.Cleanup(h2c.CloseIdleConnections)

	return &env{t: t, traefik: tr, client: &http.Client{Transport: h2c, Timeout: 10 * time.Second}}
}

// h2cTransport speaks HTTP/2 without TLS (prior knowledge), which Traefik's
// plain entrypoints serve, as SDK users reach a gateway over HTTP/2 (with
// TLS). Over HTTP/1.1, Go's server (Traefik's entrypoint) discards the rest
// of a request body when the handler answers before the proxy has read it
// to EOF (so that a client writing its whole request before it reads does
// not deadlock), racing the proxy's transport that is still
// sending it to the API, whose connection is then closed mid-answer: a
// stream ended in "unexpected EOF" about one run in three.
func h2cTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()

	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr.Protocols = &p

	return tr
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

// statusDoc is what these tests read of the status page.
type statusDoc struct {
	Layers []struct {
		Name    string `json:"name"`
		Refused int64  `json:"refused"`
	} `json:"layers"`
	Keys struct {
		Items []struct {
			Layer string `json:"layer"`
			Key   string `json:"key"`
			Count int64  `json:"count"`
		} `json:"items"`
	} `json:"keys"`
}

// status reads the status document as a loopback client, over HTTP/2.
func (e *env) status(url string) statusDoc {
	e.t.Helper()

	resp, err := e.client.Get(url)
	if err != nil {
		e.t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()

	body, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 {
		e.t.Fatalf("GET %s: answered over %s, want HTTP/2 (h2c), as the SDKs' calls", url, resp.Proto)
	}

	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		e.t.Fatalf("GET %s: %d %v %q", url, resp.StatusCode, resp.Header, body)
	}

	var doc statusDoc
	if err := json.Unmarshal(body, &doc); err != nil {
		e.t.Fatalf("GET %s: %v\n%s", url, err, body)
	}

	e.t.Logf("GET %s:\n%s", url, body)

	return doc
}

func tail(s string, lines int) string {
	all := strings.Split(s, "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}

	return strings.Join(all, "\n")
}
