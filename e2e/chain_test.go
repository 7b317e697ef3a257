package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// passedAsAnonymousChain is the recommended chain, each instance with a status
// page on a router of its own (the counters belong to the middleware, whatever
// router serves it), and ip counted over a minute so that a run of 60 requests
// cannot straddle two windows.
const passedAsAnonymousChain = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [ratelimit-edge, auth, ratelimit-principal]
      service: backend
    edge-status:
      entryPoints: [web, insecure]
      rule: PathPrefix(` + "`/_edge`" + `)
      middlewares: [ratelimit-edge]
      service: backend
    principal-status:
      entryPoints: [web]
      rule: PathPrefix(` + "`/_principal`" + `)
      middlewares: [ratelimit-principal]
      service: backend
  middlewares:
    ratelimit-edge:
      plugin:
        tierlimit:
          global: {points: 100000, duration: 1s}
          ip: {points: 50, duration: 60s}
          principal:
            credentialHeaders: [Authorization]
          status: {path: /_edge}
    auth:
      forwardAuth:
        address: "{{auth}}/auth"
        authResponseHeaders: [X-Auth-User, X-Auth-Service-Account]
    ratelimit-principal:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          principal:
            userHeader: X-Auth-User
          status: {path: /_principal}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestCredentialsPassedAsAnonymousAreChargedToTheIP: the auth server answers
// 200 without a principal for "Authorization: Basic x" (a scheme it does not
// know). Such a client gets the per-IP budget, like an anonymous one, while a
// BFF's user requests are never charged to the BFF's IP; the two status pages
// together show every request in exactly one tier bucket.
func TestCredentialsPassedAsAnonymousAreChargedToTheIP(t *testing.T) {
	e := start(t, passedAsAnonymousChain)
	e.waitRouters("api", "edge-status", "principal-status")

	const basic, anonymous = "198.51.100.10", "198.51.100.11"

	runs := []struct {
		what, path string
		hdr        map[string]string
		ok         int
	}{
		{"Basic x", "/api", merge(from(basic), map[string]string{"Authorization": "Basic x"}), 50},
		{"anonymous", "/api", from(anonymous), 50},
		{"a BFF's user", "/auth/me", bearer("user-bob"), 60},
	}

	for _, r := range runs {
		ok := 0

		for i := 1; i <= 60; i++ {
			resp := e.get(e.traefik.Web+r.path, r.hdr)

			switch {
			case resp.code == http.StatusOK && reachedBackend(resp, r.path):
				ok++
			case resp.code == http.StatusTooManyRequests && i > r.ok:
				checkRefusal(t, resp, "ip", 50)
			default:
				t.Fatalf("%s, request %d: %d %q", r.what, i, resp.code, resp.body)
			}
		}

		if ok != r.ok {
			t.Fatalf("%s: %d of 60 reached the backend, want %d", r.what, ok, r.ok)
		}
	}

	buckets := map[string]int64{}
	for _, page := range []string{"/_edge?limit=1000", "/_principal?limit=1000"} {
		for _, it := range e.status(e.traefik.Web + page).Keys.Items {
			if it.Layer != "global" {
				buckets[it.Layer+"/"+it.Key] += it.Count
			}
		}
	}

	// 50 of each client's 60 were allowed; the 10 refused spent nothing.
	want := map[string]int64{"ip/" + basic: 50, "ip/" + anonymous: 50, "user/bob": 60}
	if len(buckets) != len(want) {
		t.Fatalf("tier buckets %v, want %v", buckets, want)
	}

	for k, v := range want {
		if buckets[k] != v {
			t.Fatalf("tier buckets %v, want %v", buckets, want)
		}
	}
}

// TestStatusIsNotOpenedByASpoofedLoopback: a peer inside the default trusted
// proxies (127.0.0.2 here, any private address in general) writes
// X-Forwarded-For: 127.0.0.1; the status page stays closed to it.
func TestStatusIsNotOpenedByASpoofedLoopback(t *testing.T) {
	e := start(t, passedAsAnonymousChain)
	e.waitRouters("edge-status")

	client := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			return d.DialContext(ctx, network, addr)
		}},
	}

	// The API can report the router a moment before the entrypoint serves
	// it: a 404 from Traefik itself is retried, within a deadline.
	var code int

	var body []byte

	for deadline := time.Now().Add(10 * time.Second); ; {
		req, err := http.NewRequest(http.MethodGet, e.traefik.Insecure+"/_edge", nil)
		if err != nil {
			t.Fatal(err)
		}

		req.Header.Set("X-Forwarded-For", "127.0.0.1")

		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}

		code = resp.StatusCode
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()

		if err != nil {
			t.Fatal(err)
		}

		if code != http.StatusNotFound || time.Now().After(deadline) {
			break
		}

		time.Sleep(50 * time.Millisecond)
	}

	if strings.Contains(string(body), `"layers"`) || !reachedBackend(response{code: code, body: string(body)}, "/_edge") {
		t.Fatalf("a spoofed loopback address opened the status page: %d %q", code, body)
	}

	// The real loopback client still reads it.
	e.status(e.traefik.Web + "/_edge")
}
