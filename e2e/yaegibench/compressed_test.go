package yaegibench

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestACompressedStreamIsChargedUnderYaegi: the plugin as Traefik loads it
// (Yaegi) before a backend that answers an Anthropic Messages stream
// gzip-compressed, each event flushed, on a route charged "llm:input +
// 4*llm:output". The body is decoded by a goroutine of the interpreted
// Reader through compress/gzip, and the client gets the backend's bytes:
// the status page shows 160 input + 4 x 40 output settled.
func TestACompressedStreamIsChargedUnderYaegi(t *testing.T) {
	events := []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":100,\"cache_read_input_tokens\":50,\"cache_creation_input_tokens\":10,\"output_tokens\":1}}}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":20}}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
	}

	var sent bytes.Buffer
	backend := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if got := req.Header.Get("Accept-Encoding"); got != "gzip, deflate" {
			t.Errorf("the backend saw Accept-Encoding %q, want %q", got, "gzip, deflate")
		}
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.Header().Set("Content-Encoding", "gzip")
		z := gzip.NewWriter(io.MultiWriter(rw, &sent))
		for _, ev := range events {
			_, _ = z.Write([]byte(ev))
			_ = z.Flush()
			// The plugin's writer has no Flush under Yaegi (doc.go: wrappers);
			// it flushes after each write.
			if f, ok := rw.(http.Flusher); ok {
				f.Flush()
			}
		}
		_ = z.Close()
	})

	config := map[string]any{
		"global": map[string]any{"points": "0"},
		"ip":     map[string]any{"points": "0"},
		"status": map[string]any{"path": "/_tierlimit"},
		"routes": []any{map[string]any{
			"name": "tokens", "paths": []any{"/v1/"}, "key": "header:X-Api-Key", "points": "100000", "duration": "1h",
			"costFrom": "llm:input + 4*llm:output",
		}},
	}
	plugin := buildWith(t, "tierlimit", config, "compressed@yaegi", backend)

	req := httptest.NewRequest(http.MethodPost, "/v1/messages", nil)
	req.Header.Set("X-Api-Key", "k1")
	req.Header.Set("Accept-Encoding", "gzip, deflate, br, zstd")
	rec := httptest.NewRecorder()
	plugin.ServeHTTP(rec, req)

	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), sent.Bytes()) {
		t.Fatalf("answer %d with %d bytes, want 200 with the %d the backend sent", rec.Code, rec.Body.Len(), sent.Len())
	}

	status := httptest.NewRecorder()
	statusReq := httptest.NewRequest(http.MethodGet, "/_tierlimit", nil)
	statusReq.RemoteAddr = "127.0.0.1:1" // the status page answers local clients
	plugin.ServeHTTP(status, statusReq)

	for _, want := range []string{`"reserved":0`, `"settledPoints":320`} {
		if !strings.Contains(status.Body.String(), want) {
			t.Errorf("the status page lacks %s:\n%s", want, status.Body.String())
		}
	}
}
