package tierlimit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/tierlimit/tierlimit/events"
)

// Compiled figures for the same paths as e2e/yaegibench (which measures them
// under Yaegi, as Traefik runs them): `go test -run '^$' -bench . -benchmem`.

type benchSink struct{ h http.Header }

func (s *benchSink) Header() http.Header         { return s.h }
func (s *benchSink) Write(b []byte) (int, error) { return len(b), nil }
func (s *benchSink) WriteHeader(int)             {}

func benchRequests(n int) []*http.Request {
	out := make([]*http.Request, n)

	for i := range out {
		req, _ := http.NewRequest(http.MethodGet, "http://example.com/api/items", nil)
		req.RemoteAddr = fmt.Sprintf("100.64.%d.%d:40000", i/256, i%256)
		out[i] = req
	}

	return out
}

func benchServe(b *testing.B, h http.Handler) {
	reqs := benchRequests(1000)
	w := &benchSink{h: http.Header{}}

	b.ReportAllocs()
	b.ResetTimer()

	for i := 0; i < b.N; i++ {
		for k := range w.h {
			delete(w.h, k)
		}

		h.ServeHTTP(w, reqs[i%len(reqs)])
	}
}

func benchPlugin(b *testing.B, mutate func(c *Config)) http.Handler {
	cfg := CreateConfig()
	cfg.Global = LayerConfig{Points: 1000000000, Duration: "1s"}

	if mutate != nil {
		mutate(cfg)
	}

	h, err := New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, b.Name()+"@bench")
	if err != nil {
		b.Fatal(err)
	}

	pluginOf(h).events = events.NewEventLog(io.Discard, "bench")

	return h
}

func BenchmarkPassthrough(b *testing.B) {
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	benchServe(b, http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.Header().Set("X-Passthrough", "1")
		next.ServeHTTP(rw, req)
	}))
}

func BenchmarkEdge(b *testing.B) {
	benchServe(b, benchPlugin(b, nil))
}

func BenchmarkEdgeRefused(b *testing.B) {
	benchServe(b, benchPlugin(b, func(c *Config) { c.IP = LayerConfig{Points: 1, Duration: "1h"} }))
}

func BenchmarkEdgeParallel(b *testing.B) {
	h := benchPlugin(b, nil)
	reqs := benchRequests(1000)

	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := &benchSink{h: http.Header{}}
		i := 0

		for pb.Next() {
			for k := range w.h {
				delete(w.h, k)
			}

			h.ServeHTTP(w, reqs[i%len(reqs)])
			i++
		}
	})
}
