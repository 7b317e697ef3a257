package yaegibench

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// BenchmarkRatioTable measures, side by side in one process, each instance shape
// against the minimal limiter meeting the same contract with the same
// outcome (allowed or refused), alternating the handlers over several rounds,
// and prints the fastest round of each and their ratios: the figures of
// BENCHMARKS.md's Yaegi table. The fastest, not the median: on a shared
// machine noise only ever adds time, and one noisy round in five moved the
// medians by half. Windows last an hour, so every measured request finds its
// window started (allocsPerRequest's warm-up). It is one measurement
// whatever b.N: run it with -benchtime 1x.
func BenchmarkRatioTable(b *testing.B) {
	t := b

	refused := longEdge()
	refused["ip"] = map[string]any{"points": "1", "duration": "1h"}

	chain := longEdge()
	chain["routes"] = []any{
		map[string]any{"name": "auth_login", "methods": []any{"POST"}, "paths": []any{"/auth/login"}, "key": "ip", "points": "10", "duration": "60s"},
	}
	chain["principal"] = map[string]any{"credentialHeaders": []any{"Authorization"}}

	principal := map[string]any{
		"global":    map[string]any{"points": "0"},
		"ip":        map[string]any{"points": "0"},
		"assets":    map[string]any{"points": "0"},
		"user":      map[string]any{"points": "1000000", "duration": "1h"},
		"principal": map[string]any{"userHeader": "X-Auth-User"},
	}

	users := func(i int, req *http.Request) { req.Header.Set("X-Auth-User", "user-"+strconv.Itoa(i)) }
	token := func(_ int, req *http.Request) { req.Header.Set("Authorization", "Bearer token") }

	type shape struct {
		name  string
		h     http.Handler
		set   func(i int, req *http.Request)
		floor int // index of the minimal limiter row it is compared with
	}

	shapes := []shape{
		{"minimal limiter, allowed", build(t, "minimal", map[string]any{"seconds": "3600"}, "minimal@ratio"), nil, 0},
		{"minimal limiter, refused", build(t, "minimal", map[string]any{"points": "1", "seconds": "3600"}, "minimalrefused@ratio"), nil, 1},
		{"minimal two-layer edge (harness.MinimalEdge), allowed", build(t, "minimaledge", map[string]any{"seconds": "3600"}, "minimaledge@ratio"), nil, 0},
		{"minimal two-layer edge, refused", build(t, "minimaledge", map[string]any{"points": "1", "seconds": "3600"}, "minimaledgerefused@ratio"), nil, 1},
		{"edge (global + ip, assets), allowed", build(t, "tierlimit", longEdge(), "edge@ratio"), nil, 0},
		{"edge, refused", build(t, "tierlimit", refused, "refused@ratio"), nil, 1},
		{"minimal limiter, busy peers, allowed", build(t, "minimal", map[string]any{"seconds": "3600"}, "minimalbusy@ratio"), busyPeers, 0},
		{"minimal limiter, busy peers, refused", build(t, "minimal", map[string]any{"points": "1", "seconds": "3600"}, "minimalbusyrefused@ratio"), busyPeers, 1},
		{"edge, busy peers (1000 addresses of two networks, ports of their own), allowed", build(t, "tierlimit", longEdge(), "edgebusy@ratio"), busyPeers, 6},
		{"edge, busy peers, refused", build(t, "tierlimit", refused, "refusedbusy@ratio"), busyPeers, 7},
		{"principal instance (user tier)", build(t, "tierlimit", principal, "principal@ratio"), users, 0},
		{"chain edge (routes, credentialHeaders), anonymous", build(t, "tierlimit", chain, "chain@ratio"), nil, 0},
		{"chain edge, credentialed", build(t, "tierlimit", chain, "chaincred@ratio"), token, 0},
	}

	const rounds = 7

	times := make([][]float64, len(shapes))
	allocs := make([]int64, len(shapes))

	for r := 0; r < rounds; r++ {
		for i, sh := range shapes {
			allocs[i] = int64(allocsPerRequest(sh.h, sh.set)) // starts every window
			times[i] = append(times[i], nsPerOpWith(sh.h, sh.set))
		}
	}

	fmt.Printf("\nYaegi (Traefik's loader, in process), fastest of %d alternating rounds:\n", rounds)
	fmt.Printf("| shape | ns/request | allocations/request | ratio to the minimal limiter |\n|---|---|---|---|\n")

	for i, sh := range shapes {
		m := fastest(times[i])
		fmt.Printf("| %s | %.0f | %d | %.2f |\n", sh.name, m, allocs[i], m/fastest(times[sh.floor]))
	}

	for i, sh := range shapes {
		fmt.Printf("rounds, %s: %s\n", sh.name, rounded(times[i]))
	}
}

func fastest(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs[1:] {
		if x < m {
			m = x
		}
	}

	return m
}

// nsPerOpWith is nsPerOp with each request changed by set (nil: as they are).
func nsPerOpWith(h http.Handler, set func(i int, req *http.Request)) float64 {
	reqs := requests(1000)
	if set != nil {
		for i, req := range reqs {
			set(i, req)
		}
	}

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

// BenchmarkRedisTable is BenchmarkRatioTable for the Redis store on a real
// redis-server: tierlimit's edge (global + ip, store: redis) against
// harness.MinimalRedis, the least plugin meeting the same contract with one
// script call, and the memory floors for scale. Round trips included. It is
// one measurement whatever b.N: run it with -benchtime 1x.
func BenchmarkRedisTable(b *testing.B) {
	r, err := harness.StartRedis(b.TempDir())
	if err != nil {
		b.Skip(err)
	}
	defer r.Kill()

	cfg := longEdge()
	cfg["store"] = "redis"
	cfg["redis"] = map[string]any{"address": r.Addr, "timeout": "2s"}

	shapes := []struct {
		name string
		h    http.Handler
	}{
		{"minimal redis limiter (harness.MinimalRedis), allowed", build(b, "minimalredis", map[string]any{"address": r.Addr, "seconds": "3600"}, "minimalredis@redistable")},
		{"tierlimit edge (global + ip), store: redis, allowed", build(b, "tierlimit", cfg, "redis@redistable")},
		{"minimal two-layer edge, memory, allowed", build(b, "minimaledge", map[string]any{"seconds": "3600"}, "minimaledge@redistable")},
		{"tierlimit edge, memory, allowed", build(b, "tierlimit", longEdge(), "edge@redistable")},
	}

	const rounds = 7

	times := make([][]float64, len(shapes))
	allocs := make([]int64, len(shapes))

	for round := 0; round < rounds; round++ {
		for i, sh := range shapes {
			allocs[i] = int64(allocsPerRequest(sh.h, nil))
			times[i] = append(times[i], nsPerOpWith(sh.h, nil))
		}
	}

	fmt.Printf("\nYaegi with a redis-server (Traefik's loader, in process), fastest of %d alternating rounds:\n", rounds)
	fmt.Printf("| shape | ns/request | allocations/request | ratio to the minimal redis limiter |\n|---|---|---|---|\n")

	for i, sh := range shapes {
		fmt.Printf("| %s | %.0f | %d | %.2f |\n", sh.name, fastest(times[i]), allocs[i], fastest(times[i])/fastest(times[0]))
	}

	for i, sh := range shapes {
		fmt.Printf("rounds, %s: %s\n", sh.name, rounded(times[i]))
	}
}
