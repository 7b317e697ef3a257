package e2e

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

func newCA(t *testing.T, name string) *harness.CA {
	t.Helper()

	ca, err := harness.NewCA(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}

	return ca
}

func startTLSRedis(t *testing.T, ca *harness.CA, authClients bool, extra ...string) *harness.Redis {
	t.Helper()

	r, err := harness.StartTLSRedis(t.TempDir(), ca, authClients, extra...)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(r.Kill)

	return r
}

// indent renders a PEM block as a YAML block scalar's lines.
func indent(pem, pad string) string {
	return pad + strings.ReplaceAll(strings.TrimSpace(pem), "\n", "\n"+pad)
}

// TestRedisTLSWithOwnCA runs one Traefik (file provider, so every scalar
// arrives as a string) with a middleware per TLS setting against two
// TLS-only redis-servers whose certificates a test CA signed, the second
// requiring client certificates. The CA given as a file or inline PEM, and the
// client certificate, count in Redis; a wrong CA, the system roots and a
// missing client certificate are each logged once and memory decides with the
// same limits, never a 5xx. The plugin connects as README's ACL user.
func TestRedisTLSWithOwnCA(t *testing.T) {
	ca := newCA(t, "test")
	other := newCA(t, "other")
	plain := startTLSRedis(t, ca, false)
	mutual := startTLSRedis(t, ca, true)
	grantACL(t, plain, mutual)

	routes := []string{"cafile", "cainline", "client", "wrongca", "systemroots", "noclient"}
	tlsOf := map[string]string{
		"cafile":      `{ca: "` + ca.CAFile + `"}`,
		"cainline":    "\n              ca: |\n" + indent(ca.CAPEM, "                "),
		"client":      `{ca: "` + ca.CAFile + `", cert: "` + ca.ClientCert + `", key: "` + ca.ClientKey + `"}`,
		"wrongca":     `{ca: "` + other.CAFile + `"}`,
		"systemroots": "true",
		"noclient":    `{ca: "` + ca.CAFile + `", serverName: localhost}`,
	}
	serverOf := map[string]*harness.Redis{"cafile": plain, "cainline": plain, "client": mutual, "wrongca": plain,
		"systemroots": mutual, "noclient": mutual}

	var dyn strings.Builder

	dyn.WriteString("http:\n  routers:\n")

	for _, r := range routes {
		dyn.WriteString("    " + r + ":\n      entryPoints: [web]\n      rule: PathPrefix(`/" + r + "`)\n      middlewares: [" + r +
			"]\n      service: backend\n")
	}

	dyn.WriteString("  middlewares:\n")

	for _, r := range routes {
		dyn.WriteString("    " + r + ":\n      plugin:\n        tierlimit:\n          store: redis\n          global: {points: 0}\n" +
			"          ip: {points: 5, duration: 60s}\n          redis:\n            address: \"" + serverOf[r].Addr +
			"\"\n            username: " + aclUser + "\n            password: " + aclPassword + "\n            timeout: 1s\n            dialTimeout: 1s\n            tls: " + tlsOf[r] + "\n")
	}

	dyn.WriteString("  services:\n    backend:\n      loadBalancer:\n        servers:\n          - url: \"{{backend}}\"\n")

	e := start(t, dyn.String())
	e.waitRouters(routes...)

	client := from("198.51.100.7")

	for _, r := range routes {
		allowed := 0

		for i := 0; i < 8; i++ {
			switch resp := e.get(e.traefik.Web+"/"+r, client); resp.code {
			case http.StatusOK:
				allowed++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("%s: request %d answered %d %q", r, i, resp.code, resp.body)
			}
		}

		if allowed != 5 {
			t.Errorf("%s: %d of 8 requests allowed, want the limit 5", r, allowed)
		}
	}

	for _, r := range routes {
		admin := serverOf[r].Client(redisresp.Options{})
		v, err := admin.Do("GET", "ratelimit:"+r+"@file:ip:198.51.100.7")
		admin.Close()

		if err != nil {
			t.Fatalf("%s: reading the counter: %v", r, err)
		}

		counted := !v.Null
		if want := r == "cafile" || r == "cainline" || r == "client"; counted != want {
			t.Errorf("%s: counter in Redis %q; want it counted there: %v", r, v.String(), want)
		} else if counted && v.Str != "5" {
			t.Errorf("%s: counter in Redis %q, want 5 (the allowed; a refused request is charged nothing)", r, v.Str)
		}
	}

	logs := e.traefik.Logs()
	unknownCA := regexp.MustCompile(`unknown authority`)
	lines := map[string]int{}

	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, "REDIS_UNAVAILABLE") {
			continue
		}

		addr := plain.Addr
		if strings.Contains(line, mutual.Addr) {
			addr = mutual.Addr
		}

		kind := "other"
		if unknownCA.MatchString(line) {
			kind = "unknown CA"
		}

		lines[addr+" "+kind]++
	}

	want := map[string]int{
		plain.Addr + " unknown CA":  1, // wrongca
		mutual.Addr + " unknown CA": 1, // systemroots
		mutual.Addr + " other":      1, // noclient: the server wants a certificate
	}

	for k, n := range want {
		if lines[k] != n {
			t.Errorf("REDIS_UNAVAILABLE lines for %s: %d, want %d; all: %v\n%s", k, lines[k], n, lines, tail(logs, 20))
		}
	}

	if len(lines) != len(want) {
		t.Errorf("unexpected REDIS_UNAVAILABLE lines: %v", lines)
	}

	if strings.Contains(logs, "PRIVATE KEY") {
		t.Error("key material in Traefik's log")
	}
}
