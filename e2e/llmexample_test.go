package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// TestLLMExampleRunsInTraefik loads examples/llm/dynamic.yml as it is, with
// only the auth server's and the LLM backend's addresses pointed at the
// test's: a backend that answers as OpenAI's Chat Completions do, 4000
// tokens a call. A free key's 10000 tokens a minute admit three calls (the
// third holds the last 500-token reservation that fits) and refuse the
// fourth with OpenAI's error shape; its RateLimit shows its tokens left
// beside its slots; a pro key goes on.
func TestLLMExampleRunsInTraefik(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples/llm/dynamic.yml"))
	if err != nil {
		t.Fatal(err)
	}

	llm, stop, err := harness.Serve("127.0.0.1:0", http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":3000,"completion_tokens":1000,"total_tokens":4000}}`))
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	// The static configuration beside it loads the plugin as the harness
	// does, in local mode, and the file provider reads dynamic.yml.
	static := readYAML(t, "examples/llm/traefik.yml")[0]
	if get(static, "experimental", "localPlugins", "tierlimit", "moduleName") != harness.ModuleName ||
		get(static, "providers", "file", "filename") != "dynamic.yml" {
		t.Fatalf("examples/llm/traefik.yml: %v, want the plugin %s in local mode and the file provider on dynamic.yml", static, harness.ModuleName)
	}

	dynamic := strings.NewReplacer("http://auth:9000", "{{auth}}", "http://llm:8000", llm).Replace(string(raw))
	e := start(t, dynamic)
	e.waitRouters("llm")

	call := func(key string) response {
		return e.do(http.MethodPost, e.traefik.Web+"/v1/chat/completions", bearer(key))
	}

	for i, left := range []int{9500, 5500, 1500} {
		r := call("user-ann@free")
		if r.code != http.StatusOK {
			t.Fatalf("free call %d: %d %s", i+1, r.code, r.body)
		}

		if want := fmt.Sprintf(`"tokens_minute.free";r=%d;t=`, left); !strings.Contains(r.header.Get("RateLimit"), want) {
			t.Fatalf("free call %d: RateLimit %q, want %s... (the tokens left beside the slots)", i+1, r.header.Get("RateLimit"), want)
		}

		if !strings.HasPrefix(r.header.Get("RateLimit-Policy"), `"inflight";q=2;`) {
			t.Errorf("free call %d: RateLimit-Policy %q, want the inflight slots first", i+1, r.header.Get("RateLimit-Policy"))
		}
	}

	r := call("user-ann@free")
	var body struct {
		Error struct{ Message, Type, Code string }
	}
	if r.code != http.StatusTooManyRequests || json.Unmarshal([]byte(r.body), &body) != nil ||
		body.Error.Type != "rate_limit_exceeded" || !strings.Contains(body.Error.Message, "tokens_minute.free") {
		t.Fatalf("free call 4: %d %s, want 429 with OpenAI's error for tokens_minute.free", r.code, r.body)
	}

	if r := call("user-bob@pro"); r.code != http.StatusOK {
		t.Fatalf("a pro key after the free one ran out: %d %s", r.code, r.body)
	}
}
