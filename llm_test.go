package tierlimit

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/tierlimit/tierlimit/request"
)

// encoder makes the compressed form of a body, as a backend writes it in
// the coding its name says.
type encoder struct {
	name string
	open func(w io.Writer) io.WriteCloser
}

var encoders = []encoder{
	{"gzip", func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) }},
	{"deflate", func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) }},
	{"raw deflate", func(w io.Writer) io.WriteCloser { z, _ := flate.NewWriter(w, flate.DefaultCompression); return z }},
}

// compressed answers what next answers in enc's coding, whatever the request
// accepts, each write of next flushed through the coding and the connection
// (an event stream's events leave one by one). The client gets its bytes.
func compressed(enc encoder, next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		coding := enc.name
		if coding == "raw deflate" {
			coding = "deflate"
		}

		rw.Header().Set("Content-Encoding", coding)
		w := &encodingWriter{ResponseWriter: rw}
		w.z = enc.open(&w.out)
		next.ServeHTTP(w, req)
		_ = w.z.Close()
		_, _ = rw.Write(w.out.Bytes())
	})
}

// encodingWriter compresses each write and its compressor's flush (a data
// block, then an empty one that makes a decoder hand the data on) into one
// write of the connection, as a proxy reading them from the network would
// (the compressor writes them apart).
type encodingWriter struct {
	http.ResponseWriter
	z   io.WriteCloser
	out bytes.Buffer
}

func (w *encodingWriter) Write(b []byte) (int, error) {
	n, err := w.z.Write(b)
	if f, ok := w.z.(interface{ Flush() error }); ok {
		_ = f.Flush()
	}

	_, _ = w.ResponseWriter.Write(w.out.Bytes())
	w.out.Reset()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}

	return n, err
}

func (w *encodingWriter) Flush() {}

func (h *harness) counted(key string) int64 {
	n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey(key))
	return n
}

// A gzip- or deflate-compressed answer (Go's HTTP client, and so the
// OpenAI and Anthropic SDKs, accepts gzip; the APIs and most proxies answer
// so) is charged the tokens it states: with 400 a request and 1000 a
// minute, the fourth request is refused. The client gets the bytes the
// backend sent, compressed.
func TestACompressedAnswerIsChargedTheTokensItStates(t *testing.T) {
	body := `{"id":"x","usage":{"prompt_tokens":100,"total_tokens":400}}`

	for _, enc := range encoders {
		t.Run(enc.name, func(t *testing.T) {
			h := newProxiedHarness(t, meteredRoute("json:usage.total_tokens", 0))
			h.backend = compressed(enc, jsonBody(body))

			for i, want := range []int{200, 200, 200, 429} {
				rec := h.do(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "Accept-Encoding": "gzip, deflate"})
				if rec.Code != want {
					t.Fatalf("request %d: %d, want %d (k1 counts %d)", i+1, rec.Code, want, h.counted("k1"))
				}

				if want == 200 {
					if got := decoded(t, enc, rec.Body.Bytes()); got != body {
						t.Fatalf("request %d: the client decoded %q, want the backend's %q", i+1, got, body)
					}
				}
			}
		})
	}
}

func jsonBody(body string) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(body))
	})
}

func decoded(t *testing.T, enc encoder, b []byte) string {
	t.Helper()

	var r io.Reader
	var err error

	switch enc.name {
	case "gzip":
		r, err = gzip.NewReader(bytes.NewReader(b))
	case "deflate":
		r, err = zlib.NewReader(bytes.NewReader(b))
	default:
		r = flate.NewReader(bytes.NewReader(b))
	}

	if err != nil {
		t.Fatalf("the client's body does not decode: %v", err)
	}

	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("the client's body does not decode: %v", err)
	}

	return string(out)
}

// anthropicStream answers a Messages stream: message_start states the
// input (100, 50 read from the cache, 10 written to it) and 1 output token,
// message_delta the output so far (cumulative: 20, then 40).
func anthropicStream() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":100,"cache_read_input_tokens":50,"cache_creation_input_tokens":10,"output_tokens":1}}}`,
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`,
			`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":20}}`,
			`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":40}}`,
			`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
		} {
			_, _ = rw.Write([]byte(ev + "\n\n"))
		}
	})
}

// An Anthropic stream, gzip-compressed, with costFrom "llm:input +
// 4*llm:output": the input is every input token (100 + 50 + 10), the output
// the last message_delta's (40, cumulative): 160 + 160.
func TestACompressedAnthropicStreamIsChargedItsWeightedUsage(t *testing.T) {
	h := newProxiedHarness(t, meteredRoute("llm:input + 4*llm:output", 0))
	h.backend = compressed(encoders[0], anthropicStream())

	rec := h.do(http.MethodPost, "/v1/messages", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "Accept-Encoding": "gzip"})
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("answer %d, Content-Encoding %q, want 200 in gzip", rec.Code, rec.Header().Get("Content-Encoding"))
	}

	if n := h.counted("k1"); n != 320 {
		t.Errorf("k1 counts %d, want 320 (160 input + 4 x 40 output)", n)
	}
}

// Each provider's usage, as a JSON body, read by the llm: variables.
func TestTheUsageOfEachProviderIsRead(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       int64 // llm:input + 4*llm:output + 0.5*llm:cachedInput
	}{
		{"OpenAI Chat Completions", `{"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110,"prompt_tokens_details":{"cached_tokens":30}}}`, 100 + 40 + 15},
		{"OpenAI Responses", `{"object":"response","usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":30},"output_tokens":10,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":110}}`, 100 + 40 + 15},
		{"Anthropic Messages", `{"type":"message","usage":{"input_tokens":60,"cache_read_input_tokens":30,"cache_creation_input_tokens":10,"output_tokens":10}}`, 100 + 40 + 15},
		{"Gemini generateContent", `{"candidates":[],"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":6,"thoughtsTokenCount":4,"cachedContentTokenCount":30,"totalTokenCount":110}}`, 100 + 40 + 15},
		{"Gemini streamGenerateContent, a JSON array", `[{"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":1}},{"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":6,"thoughtsTokenCount":4,"cachedContentTokenCount":30}}]`, 100 + 40 + 15},
		{"a weight rounded up", `{"usage":{"prompt_tokens":1,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":1}}}`, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newProxiedHarness(t, meteredRoute("llm:input + 4*llm:output + 0.5*llm:cachedInput", 0))
			h.backend = jsonBody(c.body)

			if rec := h.key("k1"); rec.Code != http.StatusOK {
				t.Fatalf("answer %d", rec.Code)
			}

			if n := h.counted("k1"); n != c.want {
				t.Errorf("k1 counts %d, want %d", n, c.want)
			}
		})
	}
}

// A sum whose sources the response states in part counts the others 0; one
// that states none of them leaves the reservation, as an answer without a
// cost does.
func TestASumCountsWhatTheResponseStates(t *testing.T) {
	h := newProxiedHarness(t, meteredRoute("2*json:usage.total_tokens + 3*header:X-Extra", 5))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		if req.Header.Get("X-Api-Key") == "k1" {
			rw.Header().Set("X-Extra", "7")
		}
		if req.Header.Get("X-Api-Key") != "k3" {
			_, _ = rw.Write([]byte(`{"usage":{"total_tokens":100}}`))
		}
	})

	for key, want := range map[string]int64{"k1": 200 + 21, "k2": 200, "k3": 5} {
		if rec := h.key(key); rec.Code != http.StatusOK {
			t.Fatalf("%s: answer %d", key, rec.Code)
		}

		if n := h.counted(key); n != want {
			t.Errorf("%s counts %d, want %d", key, n, want)
		}
	}
}

// A costFrom route's request reaches the backend accepting only the codings
// the plugin decodes, so that br and zstd never arrive; other requests keep
// their Accept-Encoding.
func TestACostFromRequestAcceptsOnlyTheCodingsThePluginReads(t *testing.T) {
	h := newProxiedHarness(t, meteredRoute("json:usage.total_tokens", 0))

	var mu sync.Mutex
	var seen []string
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		mu.Lock()
		seen = append(seen, strings.Join(req.Header.Values("Accept-Encoding"), "|"))
		mu.Unlock()
	})

	for _, c := range []struct{ path, accept, want string }{
		{"/v1/chat/completions", "gzip, deflate, br, zstd", "gzip, deflate"},
		{"/v1/chat/completions", "br;q=1.0, gzip;q=0.8, *;q=0.1", "gzip;q=0.8"},
		{"/v1/chat/completions", "br", "identity"},
		{"/v1/chat/completions", "gzip", "gzip"},
		{"/other", "gzip, deflate, br, zstd", "gzip, deflate, br, zstd"},
	} {
		seen = nil
		h.do(http.MethodPost, c.path, "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "Accept-Encoding": c.accept})

		if len(seen) != 1 || seen[0] != c.want {
			t.Errorf("%s with Accept-Encoding %q: the backend saw %q, want %q", c.path, c.accept, seen, c.want)
		}
	}
}

// gzipBomb is a gzip body of about 1 MiB that decodes to 1 GiB: a JSON
// body stating 400 tokens, then a string of "a"s, in 1024 members of 1 MiB
// each (a gzip body may hold several, which a decoder reads in turn).
func gzipBomb(t *testing.T) []byte {
	t.Helper()

	var member bytes.Buffer
	z, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	_, _ = z.Write(bytes.Repeat([]byte("a"), 1<<20))
	_ = z.Close()

	var out bytes.Buffer
	z, _ = gzip.NewWriterLevel(&out, gzip.BestCompression)
	_, _ = z.Write([]byte(`{"usage":{"total_tokens":400},"pad":"`))
	_ = z.Close()

	for i := 0; i < 1024; i++ {
		out.Write(member.Bytes())
	}

	return out.Bytes()
}

// A gzip bomb (1 MiB that decodes to 1 GiB) states no cost, the request
// keeping its reservation, and costs the plugin the memory of its bound
// (1 MiB of JSON), not of the body it decodes to.
func TestAGzipBombStatesNoCostInBoundedMemory(t *testing.T) {
	bomb := gzipBomb(t)
	h := newProxiedHarness(t, meteredRoute("json:usage.total_tokens", 0))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		rw.Header().Set("Content-Encoding", "gzip")
		_, _ = rw.Write(bomb)
	})

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	rec := h.do(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "Accept-Encoding": "gzip"})

	runtime.ReadMemStats(&after)

	if rec.Code != http.StatusOK || rec.Body.Len() != len(bomb) {
		t.Fatalf("answer %d with %d bytes, want 200 with the %d the backend sent", rec.Code, rec.Body.Len(), len(bomb))
	}

	if n := h.counted("k1"); n != 1 {
		t.Errorf("k1 counts %d, want its reservation of 1: the body passed the bound", n)
	}

	// The body crosses the proxy and the front (a few copies of 1 MiB);
	// decoding it whole would allocate 1 GiB at least.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 32<<20 {
		t.Errorf("the request allocated %d MiB, want at most 32", grew>>20)
	}

	if stray := strayGoroutines(); len(stray) > 0 {
		t.Errorf("goroutines left: %v", stray)
	}
}

// decodedPrefix is what a gzip decoder makes of the first bytes of a body.
func decodedPrefix(b []byte) string {
	z, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return ""
	}

	out, _ := io.ReadAll(z)

	return string(out)
}

// A gzip-compressed stream's cost is charged once the event that states it
// is decoded, before the client has the bytes that hold it, as a plain
// stream's is (holdStated).
func TestACompressedStreamIsChargedBeforeItsEventLeaves(t *testing.T) {
	h := newHarness(t, meteredRoute("json:usage.total_tokens", 0))
	h.backend = compressed(encoders[0], http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = rw.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"))
		_, _ = rw.Write([]byte("data: {\"usage\":{\"total_tokens\":400}}\n\n"))
		_, _ = rw.Write([]byte("data: [DONE]\n\n"))
	}))

	var body []byte
	var late []string
	w := &watchCount{ResponseRecorder: httptest.NewRecorder()}
	w.count = func() int64 { return h.counted("k1") }
	wrapped := &bytesSeen{watchCount: w, seen: func(b []byte, n int64) {
		body = append(body, b...)
		if strings.Contains(decodedPrefix(body), "400") && n != 400 {
			late = append(late, fmt.Sprintf("a write of %d bytes that completes the usage event found %d counted", len(b), n))
		}
	}}

	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	req.Header.Set("X-Api-Key", "k1")
	h.h.ServeHTTP(wrapped, req)

	if len(late) > 0 || !strings.Contains(decodedPrefix(body), "[DONE]") {
		t.Errorf("%v (the client decoded %q)", late, decodedPrefix(body))
	}

	if n := h.counted("k1"); n != 400 {
		t.Errorf("k1 counts %d once the stream ended, want 400", n)
	}
}

// bytesSeen hands each write's bytes, with the count its watchCount saw, to
// seen.
type bytesSeen struct {
	*watchCount
	seen func(b []byte, n int64)
}

func (w *bytesSeen) Write(b []byte) (int, error) {
	n := w.count()
	w.seen(b, n)

	return w.ResponseRecorder.Write(b)
}

func (w *bytesSeen) Flush() {}
