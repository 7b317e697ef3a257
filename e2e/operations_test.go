package e2e

import (
	"encoding/json"
	"net/http"
	"testing"
)

const operationsDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          global:
            points: 0
          ip:
            points: 3
            duration: 60s
            algorithm: sliding
            key: header:X-Api-Key
          exempt:
            ips: [198.51.100.0/24]
          response:
            statusCode: 503
            contentType: application/problem+json
            body: '{"error":"rate_limited","layer":"{layer}","limit":{limit},"retryAfter":{retryAfter}}'
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestOperationsThroughTraefik runs exempt IPs, a header key, a sliding layer
// and a configured refusal in the real Traefik binary, so under Yaegi.
func TestOperationsThroughTraefik(t *testing.T) {
	e := start(t, operationsDynamic)
	e.waitRouters("api")

	send := func(n int, hdr map[string]string) (ok int, last response) {
		for i := 0; i < n; i++ {
			last = e.get(e.traefik.Web+"/api", hdr)
			if last.code == http.StatusOK {
				ok++
			}
		}

		return ok, last
	}

	withKey := func(client, key string) map[string]string {
		hdr := from(client)
		hdr["X-Api-Key"] = key

		return hdr
	}

	ok, last := send(5, withKey("203.0.113.20", "key-a"))
	if ok != 3 || last.code != http.StatusServiceUnavailable {
		t.Fatalf("key-a: %d of 5 allowed, last %d %q", ok, last.code, last.body)
	}

	if last.header.Get("Content-Type") != "application/problem+json" || last.header.Get("Retry-After") == "" {
		t.Fatalf("refusal headers: %v", last.header)
	}

	var body struct {
		Error      string `json:"error"`
		Layer      string `json:"layer"`
		Limit      int    `json:"limit"`
		RetryAfter int    `json:"retryAfter"`
	}

	if err := json.Unmarshal([]byte(last.body), &body); err != nil || body.Error != "rate_limited" || body.Layer != "ip" ||
		body.Limit != 3 || body.RetryAfter < 1 || body.RetryAfter > 60 {
		t.Fatalf("body %q: %+v %v", last.body, body, err)
	}

	if ok, _ := send(5, withKey("203.0.113.20", "key-b")); ok != 3 {
		t.Fatalf("key-b from the same IP: %d of 5 allowed, want its own 3", ok)
	}

	if ok, _ := send(5, from("203.0.113.20")); ok != 3 {
		t.Fatalf("no key: %d of 5 allowed, want the IP's 3", ok)
	}

	if ok, _ := send(30, from("198.51.100.7")); ok != 30 {
		t.Fatalf("exempt IP: %d of 30 allowed", ok)
	}
}
