package yaegibench

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"hash"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// The bounds of usage/doc.go and request/body.go as Traefik runs the plugin
// (Yaegi), where a Read of an interpreted Reader and every buffer it keeps
// could cost otherwise than in compiled Go: a gzip bomb and a 100 MB
// request body cost the memory of the bounds, not of the bodies.

// runs numbers the middlewares these tests build: an instance built under
// the name of an earlier one keeps its counters (a Traefik reload), which a
// second run (-count) would see.
var runs atomic.Int64

// fresh is the middleware name "<name>-<n>@yaegi", new on each call.
func fresh(name string) string {
	return name + "-" + strconv.FormatInt(runs.Add(1), 10) + "@yaegi"
}

// allocated is what fn allocated, in bytes, the heap collected before.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats

	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)

	return after.TotalAlloc - before.TotalAlloc
}

// digestWriter is a ResponseWriter that keeps only the digest and the size
// of what it is sent, so that a test's allocations are the plugin's.
type digestWriter struct {
	h    http.Header
	code int
	d    hash.Hash
	n    int64
}

func newDigestWriter() *digestWriter {
	return &digestWriter{h: http.Header{}, d: sha256.New()}
}

func (w *digestWriter) Header() http.Header { return w.h }

func (w *digestWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *digestWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.n += int64(len(b))
	return w.d.Write(b)
}

func (w *digestWriter) Flush() {}

// completeGzipBomb is a gzip body of about 1 MiB that decodes to a
// complete JSON object of 1 GiB stating 400 tokens first: read whole, it
// would state them; read within the 1 MiB bound it states nothing. 1024
// members of 1 MiB of "a" each (a gzip body may hold several, which a
// decoder reads in turn), the last one closing the object.
func completeGzipBomb() []byte {
	member := func(s string) []byte {
		var b bytes.Buffer
		z, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		_, _ = z.Write([]byte(s))
		_ = z.Close()
		return b.Bytes()
	}

	pad := member(strings.Repeat("a", 1<<20))

	var out bytes.Buffer
	out.Write(member(`{"usage":{"total_tokens":400},"pad":"`))
	for i := 0; i < 1023; i++ {
		out.Write(pad)
	}
	out.Write(member(strings.Repeat("a", 1<<20) + `"}`))

	return out.Bytes()
}

// TestAGzipBombCostsBoundedMemoryUnderYaegi: the plugin as Traefik loads it
// (Yaegi), before a backend that answers a costFrom route with a gzip
// bomb (1 MiB that decodes to a 1 GiB JSON object stating 400 tokens). The
// client gets the backend's bytes unchanged, the answer is unreported (the
// key keeps its reservation of 1, not the 400 read past the bound), and the request allocates a few MiB: the
// decoded body's 1 MiB bound and the decoder's buffers, not the 1 GiB.
func TestAGzipBombCostsBoundedMemoryUnderYaegi(t *testing.T) {
	bomb := completeGzipBomb()
	backend := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		rw.Header().Set("Content-Encoding", "gzip")
		// In 32 KiB writes, as Traefik's proxy copies a body.
		for b := bomb; len(b) > 0; {
			n := 32 << 10
			if n > len(b) {
				n = len(b)
			}
			_, _ = rw.Write(b[:n])
			b = b[n:]
		}
	})

	config := map[string]any{
		"global": map[string]any{"points": "0"},
		"ip":     map[string]any{"points": "0"},
		"status": map[string]any{"path": "/_tierlimit"},
		"routes": []any{map[string]any{
			"name": "tokens", "paths": []any{"/v1/"}, "key": "header:X-Api-Key", "points": "100000", "duration": "1h",
			"costFrom": "json:usage.total_tokens",
		}},
	}
	plugin := buildWith(t, "tierlimit", config, fresh("bomb"), backend)

	w := newDigestWriter()
	grew := allocated(func() {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		req.Header.Set("X-Api-Key", "k1")
		req.Header.Set("Accept-Encoding", "gzip")
		plugin.ServeHTTP(w, req)
	})
	t.Logf("a %d-byte gzip bomb answered: %d KiB allocated", len(bomb), grew>>10)

	if sum := sha256.Sum256(bomb); w.code != http.StatusOK || w.n != int64(len(bomb)) || !bytes.Equal(w.d.Sum(nil), sum[:]) {
		t.Fatalf("answer %d with %d bytes, want 200 with the %d the backend sent, unchanged", w.code, w.n, len(bomb))
	}

	status := httptest.NewRecorder()
	statusReq := httptest.NewRequest(http.MethodGet, "/_tierlimit", nil)
	statusReq.RemoteAddr = "127.0.0.1:1" // the status page answers local clients
	plugin.ServeHTTP(status, statusReq)

	for _, want := range []string{`"reserved":0,"settledPoints":0,"unreported":1`, `"count":1,`} {
		if !strings.Contains(status.Body.String(), want) {
			t.Errorf("the status page lacks %s (the bomb's 400 tokens charged: read past the bound?):\n%s", want, status.Body.String())
		}
	}

	// Decoding the bomb whole would allocate 1 GiB at least.
	if grew > 8<<20 {
		t.Errorf("the request allocated %d MiB, want at most 8", grew>>20)
	}
}

// genBody is a generated JSON body of size bytes, never held in memory:
// {"messages":["xxxx...","xxxx...",...]}, its model nowhere.
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

// TestAHundredMegabyteBodyCostsBoundedMemoryUnderYaegi: the plugin as
// Traefik loads it (Yaegi), a route keyed by API key and model (read from
// the request's JSON body, maxRequestBody 1 MiB), and a 100 MB request
// body, sent with its Content-Length (too long: not read at all) and
// chunked (read up to the bound, then handed on with the rest). The backend
// reads all 100 MB unchanged, the key is the API key's "unknown" model,
// and the request allocates the bound and at most 1 MiB more, not the body.
func TestAHundredMegabyteBodyCostsBoundedMemoryUnderYaegi(t *testing.T) {
	const size = 100 << 20
	const bound = 1 << 20

	var got [32]byte
	var gotN int64
	backend := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		d := sha256.New()
		gotN, _ = io.Copy(d, req.Body)
		copy(got[:], d.Sum(nil))
		_, _ = rw.Write([]byte("ok"))
	})

	config := map[string]any{
		"global": map[string]any{"points": "0"},
		"ip":     map[string]any{"points": "0"},
		"status": map[string]any{"path": "/_tierlimit"},
		"routes": []any{map[string]any{
			"name": "llm", "paths": []any{"/v1/"}, "key": "header:X-Api-Key,json:model", "points": "100", "duration": "1h", "maxRequestBody": "1MiB",
		}},
	}
	plugin := buildWith(t, "tierlimit", config, fresh("hundred"), backend)

	d := sha256.New()
	_, _ = io.Copy(d, &genBody{size: size})
	var want [32]byte
	copy(want[:], d.Sum(nil))

	send := func(body io.Reader, length int64) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		req.Body = io.NopCloser(body)
		req.ContentLength = length
		req.Header.Set("X-Api-Key", "k1")
		w := newDigestWriter()
		plugin.ServeHTTP(w, req)
		return w.code
	}

	for _, length := range []int64{size, -1} {
		// One request first, so that the pools are warm.
		send(strings.NewReader(`{"model":"m"}`), 13)

		code := 0
		grew := allocated(func() { code = send(&genBody{size: size}, length) })
		t.Logf("Content-Length %d: %d KiB allocated for a %d-byte body", length, grew>>10, size)

		if code != http.StatusOK {
			t.Fatalf("Content-Length %d: %d", length, code)
		}

		if gotN != size || got != want {
			t.Fatalf("Content-Length %d: the backend got %d bytes, want %d unchanged (same: %v)", length, gotN, size, got == want)
		}

		if most := uint64(bound + 1<<20); grew > most {
			t.Errorf("Content-Length %d: %d bytes allocated, want at most %d (maxRequestBody and 1 MiB)", length, grew, most)
		}
	}

	status := httptest.NewRecorder()
	statusReq := httptest.NewRequest(http.MethodGet, "/_tierlimit", nil)
	statusReq.RemoteAddr = "127.0.0.1:1"
	plugin.ServeHTTP(status, statusReq)

	// One warm-up request and one 100 MB body each time.
	for _, want := range []string{`|m","count":2,`, `|unknown","count":2,`} {
		if !strings.Contains(status.Body.String(), want) {
			t.Errorf("the status page lacks %s:\n%s", want, status.Body.String())
		}
	}
}
