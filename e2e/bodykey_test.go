package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// A budget per API key per model in the real Traefik: the route is keyed by
// the API key and the model read from the request's JSON body, where the
// model comes after 150 KB of messages, as the SDKs write it. The requests
// are plain POSTs with a Content-Length (no streaming request body: those
// flake under load, golang/go#40747).

const modelBudgetDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [llm]
      service: chat
  middlewares:
    llm:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 10000, duration: 60s}
          ip: {points: 1000, duration: 60s}
          routes:
            - name: chat
              methods: [POST]
              paths: [/v1/chat/completions]
              key: "header:X-Api-Key,json:model"
              maxRequestBody: 1MiB
              points: 2
              duration: 60s
  services:
    chat:
      loadBalancer:
        servers:
          - url: "{{chat}}"
`

// digestServer answers each request with the SHA-256 of the body it
// received, in X-Body-Sha256.
var digestServer = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
	d := sha256.New()
	_, _ = io.Copy(d, req.Body)
	rw.Header().Set("X-Body-Sha256", hex.EncodeToString(d.Sum(nil)))
	_, _ = rw.Write([]byte(`{"id":"x"}`))
})

// chatRequest is a Chat Completions request body: 150 KB of messages, then
// the model.
func chatRequest(t *testing.T, model string) []byte {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}

	var msgs []message
	for n := 0; n < 150; n++ {
		msgs = append(msgs, message{Role: "user", Content: strings.Repeat("more context ", 80)})
	}

	b, err := json.Marshal(struct {
		Messages []message `json:"messages"`
		Model    string    `json:"model"`
	}{msgs, model})
	if err != nil {
		t.Fatal(err)
	}

	if i := bytes.Index(b, []byte(`"model"`)); i < 150<<10 {
		t.Fatalf("the model is at byte %d, want after 150 KB", i)
	}

	return b
}

// TestABudgetPerAPIKeyPerModel: 2 requests a minute per API key per model.
// alice's third gpt-4o call is refused by the route, while her gpt-4o-mini
// calls and bob's gpt-4o calls have budgets of their own; each body reaches
// the backend unchanged.
func TestABudgetPerAPIKeyPerModel(t *testing.T) {
	eachStore(t, func(t *testing.T, store string, _ *harness.Redis) {
		chat, stop, err := harness.Serve("127.0.0.1:0", digestServer)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)

		e := start(t, strings.NewReplacer("{{store}}", store, "{{chat}}", chat).Replace(modelBudgetDynamic))
		e.waitRouters("api")

		for i, s := range []struct{ key, model, want string }{
			{"alice", "gpt-4o", "200"}, {"alice", "gpt-4o", "200"}, {"alice", "gpt-4o", "429 chat"},
			{"alice", "gpt-4o-mini", "200"}, {"bob", "gpt-4o", "200"}, {"alice", "gpt-4o-mini", "200"},
			{"alice", "gpt-4o-mini", "429 chat"}, {"bob", "gpt-4o", "200"}, {"bob", "gpt-4o", "429 chat"},
		} {
			body := chatRequest(t, s.model)
			req, err := http.NewRequest(http.MethodPost, e.traefik.Web+"/v1/chat/completions", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Api-Key", s.key)
			req.Header.Set("X-Forwarded-For", "198.51.100.30")

			res, err := e.client.Do(req)
			if err != nil {
				t.Fatalf("request %d: %v", i+1, err)
			}
			answer, _ := io.ReadAll(res.Body)
			_ = res.Body.Close()

			got := res.Status[:3]
			if res.StatusCode == http.StatusTooManyRequests {
				var refusal refusalBody
				if json.Unmarshal(answer, &refusal) == nil && len(refusal.Errors) == 1 {
					got += " " + refusal.Errors[0].Extensions.Layer
				}
			}

			if got != s.want {
				t.Fatalf("request %d (%s, %s): %s, want %s", i+1, s.key, s.model, got, s.want)
			}

			sum := sha256.Sum256(body)
			if got == "200" && res.Header.Get("X-Body-Sha256") != hex.EncodeToString(sum[:]) {
				t.Fatalf("request %d: the backend received another body (digest %s)", i+1, res.Header.Get("X-Body-Sha256"))
			}
		}
	})
}
