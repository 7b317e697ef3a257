package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

const evictionDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [capped]
      service: backend
  middlewares:
    capped:
      plugin:
        tierlimit:
          maxTracked: 1000
          global: {points: 0}
          ip: {points: 5, duration: 60s}
          status: {path: /_rl}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestEvictionKeepsALimitedClientOut: at maxTracked 1000, a client over its
// 5/60s limit stays refused after 3000 other clients have each sent a
// request: eviction drops keys under their limit first. The evictions are on
// the status page and in the metrics.
func TestEvictionKeepsALimitedClientOut(t *testing.T) {
	e := start(t, evictionDynamic)
	e.waitRouters("api")

	const limited = "198.51.100.77"

	got := e.tally(6, 1, http.MethodGet, e.traefik.Web+"/api", from(limited))
	if want := map[string]int{"200": 5, "429 ip": 1}; !sameCounts(got, want) {
		t.Fatalf("6 requests: %s, want %s", formatCounts(got), formatCounts(want))
	}

	for i := 0; i < 3000; i++ {
		client := "10." + strconv.Itoa(i/65536) + "." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256)
		if got := e.answer(http.MethodGet, e.traefik.Web+"/api", from(client)); got != "200" {
			t.Fatalf("client %s: %s", client, got)
		}
	}

	got = e.tally(3, 1, http.MethodGet, e.traefik.Web+"/api", from(limited))
	if want := map[string]int{"429 ip": 3}; !sameCounts(got, want) {
		t.Fatalf("the limited client after 3000 others: %s, want %s", formatCounts(got), formatCounts(want))
	}

	// 1 + 3000 keys in a table of 1000: 2001 evicted.
	if doc := e.status(e.traefik.Web + "/_rl"); doc.Evictions != 2001 || doc.Layers[0].TrackedKeys != 1000 {
		t.Fatalf("status: %d evictions, %d tracked; want 2001 and 1000", doc.Evictions, doc.Layers[0].TrackedKeys)
	}

	if r := e.get(e.traefik.Web+"/_rl/metrics", nil); !strings.Contains(r.body, `tierlimit_evictions_total{middleware="capped@file"} 2001`) {
		t.Fatalf("metrics without the evictions:\n%s", r.body)
	}
}
