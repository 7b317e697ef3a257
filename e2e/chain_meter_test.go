package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// meteredChain is the recommended chain for an LLM API: an edge on exact
// Redis, ForwardAuth, and the principal instance counting tokens per
// principal on synced Redis (1000 a minute, 100 reserved a request).
const meteredChain = `
http:
  routers:
    llm:
      entryPoints: [web]
      rule: PathPrefix(` + "`/v1/`" + `)
      middlewares: [llm-edge, auth, llm-tokens]
      service: llm
  middlewares:
    llm-edge:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}"}
          global: {points: 0}
          ip: {points: 50, duration: 60s}
          principal:
            credentialHeaders: [Authorization]
    auth:
      forwardAuth:
        address: "{{auth}}/auth"
        authResponseHeaders: [X-Auth-User]
    llm-tokens:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}", syncInterval: 100ms}
          global: {points: 0}
          ip: {points: 0}
          principal:
            userHeader: X-Auth-User
          routes:
            - {name: tpm, paths: [/v1/], key: principal, points: 1000, duration: 60s, costFrom: "json:usage.total_tokens", reserve: 100}
  services:
    llm:
      loadBalancer:
        servers:
          - url: "{{llm}}"
`

// TestTokensAfterForwardAuthAreCountedOnSyncedRedis: through Traefik, the
// instance after ForwardAuth settles its costFrom route in its own synced
// counters, not through the edge's store: two 500-token answers spend the
// 1000 a minute, and the third request is refused.
func TestTokensAfterForwardAuthAreCountedOnSyncedRedis(t *testing.T) {
	r := startRedis(t)

	llm := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"object":"chat.completion","choices":[],"usage":{"total_tokens":500}}`))
	})

	url, stop, err := harness.Serve("127.0.0.1:0", llm)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	e := startWith(t, strings.NewReplacer("{{redis}}", r.Addr, "{{llm}}", url).Replace(meteredChain), harness.Options{})
	e.waitRouters("llm")

	alice := map[string]string{"Authorization": "Bearer user-alice", "X-Forwarded-For": "198.51.100.80"}
	for i, want := range []string{"200", "200", "429 tpm", "429 tpm"} {
		if got := e.answer(http.MethodPost, e.traefik.Web+"/v1/chat/completions", alice); got != want {
			t.Fatalf("completion %d of alice (500 tokens each, 1000 a minute): %s, want %s", i+1, got, want)
		}
	}
}
