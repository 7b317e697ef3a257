package tierlimit

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tierlimit/tierlimit/config"
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

// Routes keyed by the request body (json:<path>) and by several sources.

// chatBody is a Chat Completions request as the SDKs write it: the
// messages (pad bytes of them), then the model.
func chatBody(model string, pad int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"messages":[`)
	for n := 0; b.Len() < pad; n++ {
		if n > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"role":"user","content":"` + strings.Repeat("tell me more ", 80) + `"}`)
	}
	b.WriteString(`],"model":"` + model + `","stream":false}`)

	return b.Bytes()
}

// bodySink is a backend that keeps the digest and length of each body it
// received, and how it was sent.
type bodySink struct {
	mu     sync.Mutex
	got    [][32]byte
	sizes  []int64
	length []int64 // the request's ContentLength as the backend saw it
}

func (s *bodySink) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	d := sha256.New()
	n, _ := io.Copy(d, req.Body)

	var sum [32]byte
	copy(sum[:], d.Sum(nil))

	s.mu.Lock()
	s.got = append(s.got, sum)
	s.sizes = append(s.sizes, n)
	s.length = append(s.length, req.ContentLength)
	s.mu.Unlock()

	_, _ = rw.Write([]byte("ok"))
}

func (s *bodySink) last() ([32]byte, int64, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()

	i := len(s.got) - 1

	return s.got[i], s.sizes[i], s.length[i]
}

// modelRoute is a route of 2 requests a minute per API key per model.
func modelRoute(key string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.Routes = []config.RouteConfig{{Name: "llm", Methods: []string{"POST"}, Paths: []string{"/v1/chat/completions"}, Key: key, Points: 2, Duration: "60s"}}
	}
}

// A route keyed by "header:X-Api-Key,json:model" keeps a budget per API
// key per model, the model read after 150 KB of messages, with and without
// a Content-Length: alice's gpt-4o calls touch neither her gpt-4o-mini
// budget nor bob's. The backend receives each body as sent. On memory,
// exact Redis and synced Redis.
func TestARouteKeyedByTheModelKeepsABudgetPerKeyPerModel(t *testing.T) {
	addr, _ := redisServer(t)
	stores := []struct {
		name string
		make func(t *testing.T, mutate func(c *Config)) *harness
	}{
		{"memory", newProxiedHarness},
		{"exact Redis", func(t *testing.T, mutate func(c *Config)) *harness {
			h, _ := redisHarness(t, addr, with(mutate, asACLUser))
			return behindProxy(t, h)
		}},
		{"synced Redis", func(t *testing.T, mutate func(c *Config)) *harness {
			h, _, _ := syncHarness(t, addr, with(mutate, asACLUser))
			return behindProxy(t, h)
		}},
	}

	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			h := st.make(t, modelRoute("header:X-Api-Key,json:model"))
			sink := &bodySink{}
			h.backend = sink

			steps := []struct {
				key, model string
				want       int
			}{
				{"alice", "gpt-4o", 200}, {"alice", "gpt-4o", 200}, {"alice", "gpt-4o", 429},
				{"alice", "gpt-4o-mini", 200}, {"bob", "gpt-4o", 200}, {"alice", "gpt-4o-mini", 200},
				{"alice", "gpt-4o-mini", 429}, {"bob", "gpt-4o", 200}, {"bob", "gpt-4o", 429},
			}

			for i, s := range steps {
				body := chatBody(s.model, 150<<10)
				length := int64(len(body))
				if i%2 == 1 {
					length = -1 // chunked
				}

				rec := h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", map[string]string{"X-Api-Key": s.key}, bytes.NewReader(body), length)
				if rec.Code != s.want {
					t.Fatalf("request %d (%s, %s): %d, want %d", i+1, s.key, s.model, rec.Code, s.want)
				}

				if s.want != 200 {
					continue
				}

				sum, n, cl := sink.last()
				if sum != sha256.Sum256(body) || n != int64(len(body)) || cl != length {
					t.Fatalf("request %d: the backend got %d bytes (Content-Length %d), want the %d sent (%d), unchanged: %v", i+1, n, cl, len(body), length, sum == sha256.Sum256(body))
				}
			}
		})
	}
}

// The key of a request whose body does not state the field is "unknown",
// one bucket, and such a body reaches the backend unchanged: not JSON, no
// model, a model that is not a string or number, a model beyond
// maxRequestBody. A number is a key as written.
func TestABodyWithoutTheFieldIsKeyedUnknown(t *testing.T) {
	h := newProxiedHarness(t, with(modelRoute("json:model"), func(c *Config) {
		c.Routes[0].Points = 100
		c.Routes[0].MaxRequestBody = "64KiB"
	}))
	sink := &bodySink{}
	h.backend = sink

	for _, c := range []struct {
		body, key string
	}{
		{"model=gpt-4o", "unknown"},
		{`{"messages":[]}`, "unknown"},
		{`{"model":["gpt-4o"]}`, "unknown"},
		{string(chatBody("gpt-4o", 100<<10)), "unknown"},
		{`{"model":4e2}`, "4e2"},
		{`{"model":"` + strings.Repeat("m", 200) + `"}`, request.HashKey(strings.Repeat("m", 200))},
		{`{"model":"gpt\u002d4o"}`, "gpt-4o"},
	} {
		before, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", c.key)
		rec := h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", nil, strings.NewReader(c.body), int64(len(c.body)))
		after, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", c.key)

		if rec.Code != 200 || after != before+1 {
			t.Errorf("body %.40q: %d, key %q counts %d, want 200 and %d", c.body, rec.Code, c.key, after, before+1)
		}

		if sum, n, _ := sink.last(); sum != sha256.Sum256([]byte(c.body)) {
			t.Errorf("body %.40q: the backend got %d other bytes", c.body, n)
		}
	}
}

// genBody is a generated JSON body of size bytes, never held in memory:
// {"messages":["xxxx...","xxxx...",...]} padded with spaces to size.
type genBody struct {
	size, off int64
}

const genHead, genTail = `{"messages":["`, `"]}`

func (g *genBody) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}

	n := 0
	for n < len(p) && g.off < g.size {
		var c byte
		switch {
		case g.off < int64(len(genHead)):
			c = genHead[g.off]
		case g.off >= g.size-int64(len(genTail)):
			c = genTail[g.off-(g.size-int64(len(genTail)))]
		case g.off%1024 == 0:
			c = '"'
		case g.off%1024 == 1:
			c = ','
		case g.off%1024 == 2:
			c = '"'
		default:
			c = 'x'
		}
		p[n] = c
		n++
		g.off++
	}

	return n, nil
}

// genDigest is the digest and size of genBody{size}.
func genDigest(size int64) [32]byte {
	d := sha256.New()
	_, _ = io.Copy(d, &genBody{size: size})

	var sum [32]byte
	copy(sum[:], d.Sum(nil))

	return sum
}

// A 100 MB body on a json-keyed route costs bounded memory: at most
// maxRequestBody (1 MiB here), the bytes read before the body is known to
// be too long, and a megabyte more for the proxy and the servers; the
// backend receives all 100 MB unchanged, sent with their Content-Length
// (not read at all: too long) or chunked (read up to the bound).
func TestAHundredMegabyteBodyCostsBoundedMemory(t *testing.T) {
	const size = 100 << 20
	const bound = 1 << 20

	h := newProxiedHarness(t, with(modelRoute("header:X-Api-Key,json:model"), func(c *Config) {
		c.Routes[0].MaxRequestBody = "1MiB"
	}))
	sink := &bodySink{}
	h.backend = sink
	want := genDigest(size)

	for _, length := range []int64{size, -1} {
		// One request first, so that the connections and pools are warm.
		h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", map[string]string{"X-Api-Key": "k"}, strings.NewReader(`{"model":"m"}`), -1)

		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)

		rec := h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", map[string]string{"X-Api-Key": "k"}, &genBody{size: size}, length)

		runtime.ReadMemStats(&after)
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("Content-Length %d: %d bytes allocated for a %d-byte body", length, allocated, size)

		if rec.Code != 200 {
			t.Fatalf("Content-Length %d: %d", length, rec.Code)
		}

		if sum, n, _ := sink.last(); sum != want || n != size {
			t.Fatalf("Content-Length %d: the backend got %d bytes, want %d unchanged (same: %v)", length, n, size, sum == want)
		}

		if allocated > bound+1<<20 {
			t.Errorf("Content-Length %d: %d bytes allocated, want at most %d", length, allocated, bound+1<<20)
		}

		if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k")+"|unknown"); n == 0 {
			t.Errorf("Content-Length %d: not counted as unknown", length)
		}
	}
}

// A client that hangs up while its body is read: the request's key is
// "unknown", its handler returns, nothing of the plugin stays behind, and
// the next request is served.
func TestAClientHangingUpDuringItsBodyLeavesNothingBehind(t *testing.T) {
	h := newProxiedHarness(t, modelRoute("json:model"))

	for _, chunked := range []bool{false, true} {
		id, ended := h.front.expect()
		conn, err := net.Dial("tcp", h.front.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}

		head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + reqIDHeader + ": " + id + "\r\nContent-Type: application/json\r\n"
		part := `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 64<<10)
		if chunked {
			head += "Transfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(part)), 16) + "\r\n" + part + "\r\n"
		} else {
			head += "Content-Length: " + strconv.Itoa(1<<20) + "\r\n\r\n" + part
		}

		if _, err := conn.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
		_ = conn.Close()

		waitEnded(t, ended, "the request cut in its body")
	}

	h.quiet()

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", "unknown"); n != 2 {
		t.Errorf("the cut requests count %d in the unknown bucket, want 2", n)
	}

	if rec := h.send(http.MethodPost, "/v1/chat/completions", "203.0.113.5:1", nil, strings.NewReader(`{"model":"m"}`), 13); rec.Code != 200 {
		t.Fatalf("the next request: %d", rec.Code)
	}

	h.cancel()
	if !waitCond(func() bool { return len(strayGoroutines()) == 0 }) {
		t.Fatalf("goroutines left behind:\n%s", strings.Join(strayGoroutines(), "\n\n"))
	}
}

// A countStatus route keyed by the body charges a listed status to the
// key the body named, read before the backend took the body: failed logins
// per username.
func TestAFailedLoginIsChargedToTheUsernameItNamed(t *testing.T) {
	h := newProxiedHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.Routes = []config.RouteConfig{{Name: "login", Methods: []string{"POST"}, Paths: []string{"/login"}, Key: "json:username", Points: 2, Duration: "60s", CountStatus: []int{401}}}
	})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		if !bytes.Contains(b, []byte(`"password":"right"`)) {
			rw.WriteHeader(http.StatusUnauthorized)
		}
	})

	login := func(user, password string) int {
		body := `{"username":"` + user + `","password":"` + password + `"}`
		return h.send(http.MethodPost, "/login", "203.0.113.5:1", nil, strings.NewReader(body), int64(len(body))).Code
	}

	for i, want := range []int{401, 401, 429} {
		if got := login("bob", "wrong"); got != want {
			t.Fatalf("bob's login %d: %d, want %d", i+1, got, want)
		}
	}

	if got := login("alice", "right"); got != 200 {
		t.Fatalf("alice's login: %d, want 200 (only bob's failures count against bob)", got)
	}

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "login", "bob"); n != 2 {
		t.Fatalf("bob's failures count %d, want 2", n)
	}
}

// A route's plan is keyed as the route is: with key header:X-Api-Key, each
// API key of a principal on the pro plan has the plan's 2 points on the
// route (the plan's layer once fell back to the client IP, one bucket for
// every key).
func TestARoutePlanIsKeyedAsItsRoute(t *testing.T) {
	h := newProxiedHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.User = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.Principal.UserHeader, c.Principal.PlanHeader = "X-Auth-User", "X-Auth-Plan"
		c.Plans = map[string]config.PlanConfig{"pro": {Points: 1000, Duration: "60s"}}
		c.Routes = []config.RouteConfig{{Name: "llm", Paths: []string{"/v1/"}, Key: "header:X-Api-Key", Points: 5, Duration: "60s",
			Plans: map[string]config.PlanConfig{"pro": {Points: 2, Duration: "60s"}}}}
	})

	for i, s := range []struct {
		key  string
		want int
	}{{"k1", 200}, {"k1", 200}, {"k1", 429}, {"k2", 200}, {"k2", 200}, {"k2", 429}} {
		rec := h.do(http.MethodPost, "/v1/chat", "203.0.113.5:1", map[string]string{"X-Auth-User": "carol", "X-Auth-Plan": "pro", "X-Api-Key": s.key})
		if rec.Code != s.want {
			t.Fatalf("request %d (%s): %d, want %d", i+1, s.key, rec.Code, s.want)
		}
	}
}
