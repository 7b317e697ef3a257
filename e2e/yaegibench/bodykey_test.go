package yaegibench

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestABudgetPerModelUnderYaegi: the plugin as Traefik loads it (Yaegi), a route
// keyed by API key and model, 2 points each, read from bodies in each way
// the plugin reads one: with a Content-Length, chunked (no length: read in
// blocks), and holding more than 1024 colons (read through a decoder), the
// model after 100 KB of messages. gpt-4o and gpt-4o-mini keep budgets of
// their own, and the backend reads each body unchanged.
func TestABudgetPerModelUnderYaegi(t *testing.T) {
	var got []byte
	backend := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		got, _ = io.ReadAll(req.Body)
	})

	config := map[string]any{
		"global": map[string]any{"points": "0"},
		"ip":     map[string]any{"points": "0"},
		"routes": []any{map[string]any{
			"name": "llm", "paths": []any{"/v1/"}, "key": "header:X-Api-Key,json:model", "points": "2", "duration": "1h", "maxRequestBody": "1MiB",
		}},
	}

	for _, how := range []string{"length", "chunked", "colons"} {
		plugin := buildWith(t, "tierlimit", config, "bodykey-"+how+"@yaegi", backend)

		for i, model := range []string{"gpt-4o", "gpt-4o-mini", "gpt-4o", "gpt-4o-mini", "gpt-4o", "gpt-4o-mini"} {
			content := strings.Repeat("x", 1000)
			if how == "colons" {
				content = strings.Repeat("a: b ", 200)
			}
			body := []byte(`{"messages":[` + strings.Repeat(`{"role":"user","content":"`+content+`"},`, 100) + `{"role":"user","content":"hi"}],"model":"` + model + `"}`)

			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
			req.RemoteAddr = "203.0.113.1:1234"
			req.Header.Set("X-Api-Key", "k1")
			if how == "chunked" {
				req.Body = io.NopCloser(bytes.NewReader(body))
				req.ContentLength = -1
			}

			got = nil
			rec := httptest.NewRecorder()
			plugin.ServeHTTP(rec, req)

			want := http.StatusOK
			if i >= 4 {
				want = http.StatusTooManyRequests
			}

			if rec.Code != want {
				t.Fatalf("%s: request %d (%s): %d, want %d", how, i+1, model, rec.Code, want)
			}

			if want == http.StatusOK && !bytes.Equal(got, body) {
				t.Fatalf("%s: request %d: the backend read %d bytes, want the %d sent, unchanged", how, i+1, len(got), len(body))
			}
		}
	}
}
