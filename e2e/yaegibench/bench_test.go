// Package yaegibench measures the plugin as Traefik runs it: loaded by
// Traefik's own Yaegi loader (pkg/plugins), in process, against a passthrough
// plugin loaded the same way. Measurements are benchmarks only (`make bench`
// runs them), so `go test` reports no test here that cannot fail.
package yaegibench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/traefik/traefik/v3/pkg/plugins"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

var builder *plugins.Builder

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tierlimit-yaegibench-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	if err := setup(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	os.Exit(m.Run())
}

// setup lays out plugins-local with both plugins and builds them with
// Traefik's loader, which reads ./plugins-local relative to the working directory.
func setup(dir string) error {
	gopath := filepath.Join(dir, "plugins-local")
	if err := harness.CopyPlugin(gopath); err != nil {
		return err
	}

	if err := harness.Passthrough.Write(gopath); err != nil {
		return err
	}

	if err := harness.MinimalLimiter.Write(gopath); err != nil {
		return err
	}

	if err := harness.MinimalEdge.Write(gopath); err != nil {
		return err
	}

	if err := harness.MinimalRedis.Write(gopath); err != nil {
		return err
	}

	if err := os.Chdir(dir); err != nil {
		return err
	}

	b, err := plugins.NewBuilder(nil, nil, map[string]plugins.LocalDescriptor{
		"tierlimit":    {ModuleName: harness.ModuleName},
		"passthrough":  {ModuleName: harness.Passthrough.Module},
		"minimal":      {ModuleName: harness.MinimalLimiter.Module},
		"minimaledge":  {ModuleName: harness.MinimalEdge.Module},
		"minimalredis": {ModuleName: harness.MinimalRedis.Module},
	})
	if err != nil {
		return fmt.Errorf("loading the plugins with Traefik's loader: %w", err)
	}

	builder = b

	return nil
}

func build(t testing.TB, plugin string, config map[string]any, name string) http.Handler {
	t.Helper()

	return buildWith(t, plugin, config, name, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
}

// buildWith is build in front of the backend next.
func buildWith(t testing.TB, plugin string, config map[string]any, name string, next http.Handler) http.Handler {
	t.Helper()

	ctor, err := builder.Build(plugin, config, name)
	if err != nil {
		t.Fatal(err)
	}

	h, err := ctor(context.Background(), next)
	if err != nil {
		t.Fatal(err)
	}

	return h
}

// The typical edge: global + ip (its default 50/1s),
// headers on, memory store. The benchmark spreads requests over enough client
// addresses (requests) that nothing is refused; global is raised for the same reason.
func edgeConfig() map[string]any {
	return map[string]any{
		"global": map[string]any{"points": "1000000000", "duration": "1s"},
		"ip":     map[string]any{"points": "50", "duration": "1s"},
	}
}

// sink is a ResponseWriter that keeps nothing, so both plugins pay the same.
type sink struct{ h http.Header }

func (s *sink) Header() http.Header         { return s.h }
func (s *sink) Write(b []byte) (int, error) { return len(b), nil }
func (s *sink) WriteHeader(int)             {}

// requests from distinct client addresses (untrusted peers, keyed as they are).
func requests(n int) []*http.Request {
	out := make([]*http.Request, n)

	for i := range out {
		req, _ := http.NewRequest(http.MethodGet, "http://example.com/api/items", nil)
		req.RemoteAddr = fmt.Sprintf("100.64.%d.%d:40000", i/256, i%256)
		out[i] = req
	}

	return out
}

// busyPeers are n requests each from a peer of its own, with a port of its
// own, as a busy edge sees its clients: the set of allocsPerRequest and
// nsPerOpWith that spreads the requests over two networks.
func busyPeers(i int, req *http.Request) {
	req.RemoteAddr = fmt.Sprintf("198.%d.%d.%d:%d", 18+i%2, i/256%4, i%256, 1024+i)
}

func run(b *testing.B, h http.Handler) {
	runWith(b, h, nil)
}

// runWith is run with each request changed by set (nil: as they are).
func runWith(b *testing.B, h http.Handler, set func(i int, req *http.Request)) {
	reqs := requests(1000)

	if set != nil {
		for i, req := range reqs {
			set(i, req)
		}
	}

	w := &sink{h: http.Header{}}

	b.ReportAllocs()
	b.ResetTimer()

	for i := 0; i < b.N; i++ {
		for k := range w.h {
			delete(w.h, k)
		}

		h.ServeHTTP(w, reqs[i%len(reqs)])
	}
}

func BenchmarkYaegiPassthrough(b *testing.B) {
	run(b, build(b, "passthrough", nil, "pass@bench"))
}

func BenchmarkYaegiMinimalLimiter(b *testing.B) {
	run(b, build(b, "minimal", nil, "minimal@bench"))
}

func BenchmarkYaegiTierlimitEdge(b *testing.B) {
	run(b, build(b, "tierlimit", edgeConfig(), "edge@bench"))
}

// The edge instance of the recommended chain (README.md): global, ip,
// assets, the login and e-mail routes, credentialHeaders [Authorization];
// anonymous requests to a path no route matches, as most traffic is.
func BenchmarkYaegiTierlimitChainEdge(b *testing.B) {
	cfg := edgeConfig()
	cfg["routes"] = []any{
		map[string]any{"name": "auth_login", "methods": []any{"POST"}, "paths": []any{"/auth/login"}, "key": "ip", "points": "10", "duration": "60s"},
		map[string]any{"name": "email", "methods": []any{"POST"}, "paths": []any{"/auth/password/request", "/users/invite"}, "key": "ip", "points": "5", "duration": "60s"},
	}
	cfg["principal"] = map[string]any{"credentialHeaders": []any{"Authorization"}}
	run(b, build(b, "tierlimit", cfg, "chainedge@bench"))
}

// The same edge for a request with a token: charged to global only up front,
// its response watched for a 401 (the credential writer).
func BenchmarkYaegiTierlimitChainEdgeCredentialed(b *testing.B) {
	cfg := edgeConfig()
	cfg["principal"] = map[string]any{"credentialHeaders": []any{"Authorization"}}
	runWith(b, build(b, "tierlimit", cfg, "chainedgecred@bench"), func(_ int, req *http.Request) {
		req.Header.Set("Authorization", "Bearer token")
	})
}

func BenchmarkYaegiTierlimitRedis(b *testing.B) {
	r, err := harness.StartRedis(b.TempDir())
	if err != nil {
		b.Skip(err)
	}
	defer r.Kill()

	cfg := edgeConfig()
	cfg["store"] = "redis"
	cfg["redis"] = map[string]any{"address": r.Addr, "timeout": "1s"}
	run(b, build(b, "tierlimit", cfg, "redis@bench"))
}

// The principal instance of the recommended chain: user tier only, keyed by
// the X-Auth-User that ForwardAuth set (1000 users).
func BenchmarkYaegiTierlimitPrincipal(b *testing.B) {
	cfg := map[string]any{
		"global":    map[string]any{"points": "0"},
		"ip":        map[string]any{"points": "0"},
		"assets":    map[string]any{"points": "0"},
		"principal": map[string]any{"userHeader": "X-Auth-User"},
	}
	runWith(b, build(b, "tierlimit", cfg, "principal@bench"), func(i int, req *http.Request) {
		req.Header.Set("X-Auth-User", "user-"+strconv.Itoa(i))
	})
}

func BenchmarkYaegiTierlimitRefused(b *testing.B) {
	cfg := edgeConfig()
	cfg["ip"] = map[string]any{"points": "1", "duration": "1h"}
	run(b, build(b, "tierlimit", cfg, "refused@bench"))
}

// BenchmarkCostTable runs the passthrough and edge benchmarks alternately,
// several times, and prints the medians and their ratio (the figure in
// BENCHMARKS.md). It is one measurement whatever b.N: run it with -benchtime 1x.
func BenchmarkCostTable(b *testing.B) {
	pass := build(b, "passthrough", nil, "pass@cost")
	minimal := build(b, "minimal", nil, "minimal@cost")
	edge := build(b, "tierlimit", edgeConfig(), "edge@cost")
	refusedCfg := edgeConfig()
	refusedCfg["ip"] = map[string]any{"points": "1", "duration": "1h"}
	refused := build(b, "tierlimit", refusedCfg, "refused@cost")

	const rounds = 5

	var p, m, e, r []float64

	for i := 0; i < rounds; i++ {
		p = append(p, nsPerOp(pass))
		m = append(m, nsPerOp(minimal))
		e = append(e, nsPerOp(edge))
		r = append(r, nsPerOp(refused))
	}

	mp, mm, me, mr := median(p), median(m), median(e), median(r)

	fmt.Printf("\nYaegi (Traefik's loader, in process), median of %d rounds:\n", rounds)
	fmt.Printf("| handler | ns/op | ratio to passthrough |\n|---|---|---|\n")
	fmt.Printf("| passthrough plugin (sets a header, calls next) | %.0f | 1.00 |\n", mp)
	fmt.Printf("| minimal limiter plugin (harness.MinimalLimiter: one window, five headers) | %.0f | %.2f |\n", mm, mm/mp)
	fmt.Printf("| tierlimit edge (global + ip, headers, memory), allowed | %.0f | %.2f |\n", me, me/mp)
	fmt.Printf("| tierlimit edge, refused (429 with body) | %.0f | %.2f |\n", mr, mr/mp)
	fmt.Printf("rounds: passthrough %v; minimal %v; edge %v; refused %v\n", rounded(p), rounded(m), rounded(e), rounded(r))
	b.ReportMetric(me/mp, "edge/passthrough")
}

// nsPerOp times h over run's requests for about a second. It times the loop
// itself: testing.Benchmark cannot run inside a benchmark (it deadlocks).
func nsPerOp(h http.Handler) float64 {
	reqs := requests(1000)
	w := &sink{h: http.Header{}}
	n := 0
	start := time.Now()

	for time.Since(start) < time.Second {
		for _, req := range reqs {
			for k := range w.h {
				delete(w.h, k)
			}

			h.ServeHTTP(w, req)
		}

		n += len(reqs)
	}

	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)

	return s[len(s)/2]
}

func rounded(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 0, 64)
	}

	return strings.Join(parts, " ")
}

// BenchmarkMemoryTable measures bytes per tracked key under Yaegi and the
// resident memory after a flood of 1,000,000 distinct client IPs with
// maxTracked 100000. It is one measurement whatever b.N: run it with -benchtime 1x.
func BenchmarkMemoryTable(b *testing.B) {
	cfg := edgeConfig()
	cfg["global"] = map[string]any{"points": "0"}
	cfg["ip"] = map[string]any{"points": "1000", "duration": "1h"}
	cfg["maxTracked"] = "100000"
	h := build(b, "tierlimit", cfg, "flood@mem")

	w := &sink{h: http.Header{}}
	req, _ := http.NewRequest(http.MethodGet, "http://example.com/api", nil)

	flood := func(from, to int) {
		for i := from; i < to; i++ {
			req.RemoteAddr = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ":1"
			// Not trusted proxies: keep every address its own key.
			req.RemoteAddr = strings.Replace(req.RemoteAddr, "10.", "100.", 1)

			for k := range w.h {
				delete(w.h, k)
			}

			h.ServeHTTP(w, req)
		}
	}

	heap0, rss0 := memory()
	flood(0, 100000)
	heap1, rss1 := memory()
	flood(100000, 1000000)
	heap2, rss2 := memory()

	fmt.Printf("\nMemory under Yaegi (maxTracked 100000, ip layer only):\n")
	fmt.Printf("| after | live heap | resident (VmRSS) |\n|---|---|---|\n")
	fmt.Printf("| plugin loaded | %.1f MiB | %.1f MiB |\n", mib(heap0), mib(rss0))
	fmt.Printf("| 100,000 distinct IPs | %.1f MiB | %.1f MiB |\n", mib(heap1), mib(rss1))
	fmt.Printf("| 1,000,000 distinct IPs | %.1f MiB | %.1f MiB |\n", mib(heap2), mib(rss2))
	fmt.Printf("bytes per tracked key (live heap): %.0f\n", float64(heap1-heap0)/100000)
	fmt.Printf("flood growth over 100,000 keys: heap %.2fx, resident %.2fx\n",
		float64(heap2-heap0)/float64(heap1-heap0), float64(rss2-rss0)/float64(rss1-rss0))
	b.ReportMetric(float64(heap1-heap0)/100000, "B/key")
}

func memory() (heap, rss uint64) {
	runtime.GC()
	debug.FreeOSMemory()

	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)

	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			rss = kb * 1024
		}
	}

	return ms.HeapAlloc, rss
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
