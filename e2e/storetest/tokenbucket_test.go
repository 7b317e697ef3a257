package storetest

import (
	"context"
	"encoding/json"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"golang.org/x/time/rate"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
)

// layerCounts reads a layer's allowed and refused counters from the status
// endpoint of h (allowed to 127.0.0.1 by default).
func layerCounts(t *testing.T, h http.Handler, layer string) (allowed, refused int64) {
	t.Helper()

	req := httptest.NewRequest(http.MethodGet, "/_ratelimit", nil)
	req.RemoteAddr = "127.0.0.1:1"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	var doc struct {
		Layers []struct {
			Name             string
			Allowed, Refused int64
		}
	}

	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("status: %v: %s", err, rec.Body.String())
	}

	for _, l := range doc.Layers {
		if l.Name == layer {
			return l.Allowed, l.Refused
		}
	}

	t.Fatalf("status has no layer %s: %s", layer, rec.Body.String())

	return 0, 0
}

// TestTokenBucketMatchesXTimeRateOnMiniredis sends the same seeded random
// request times to golang.org/x/time/rate's limiter, built as Traefik's
// rateLimit builds it (rate = average / period, burst), and to a tierlimit
// token bucket on Redis, whose script reads the time from Redis (miniredis,
// whose clock the test sets). Every answer must be the same. The instance runs
// in dry run so that its local block list, which uses the real clock, stays
// out of the way; its decisions are read from the status counters.
func TestTokenBucketMatchesXTimeRateOnMiniredis(t *testing.T) {
	m := miniredis.RunT(t)

	cases := []struct {
		average, burst int
		period         time.Duration
		maxGap         time.Duration
	}{
		{average: 10, burst: 3, period: time.Second, maxGap: 200 * time.Millisecond},
		{average: 3, burst: 5, period: time.Minute, maxGap: 30 * time.Second},
		{average: 1000, burst: 50, period: time.Second, maxGap: 1500 * time.Microsecond},
		{average: 7, burst: 1, period: 3 * time.Second, maxGap: time.Second},
		{average: 100, burst: 100, period: time.Second, maxGap: 15 * time.Millisecond},
	}

	for n, tc := range cases {
		cfg := tierlimit.CreateConfig()
		cfg.Store = "redis"
		cfg.Redis.Address = m.Addr()
		cfg.Redis.Timeout = "2s"
		cfg.DryRun = true
		cfg.Status.Path = "/_ratelimit"
		cfg.Global.Points = 0
		cfg.IP = config.LayerConfig{Points: tc.average, Duration: tc.period.String(), Algorithm: "tokenbucket", Burst: tc.burst}

		h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, "xrate"+strconv.Itoa(n)+"@test")
		if err != nil {
			t.Fatal(err)
		}

		lim := rate.NewLimiter(rate.Limit(float64(tc.average)*float64(time.Second)/float64(tc.period)), tc.burst)
		rng := rand.New(rand.NewSource(int64(n + 1)))
		now := time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC)
		refused := 0

		for i := 0; i < 1500; i++ {
			now = now.Add(time.Duration(rng.Int63n(int64(tc.maxGap/time.Microsecond))) * time.Microsecond)
			m.SetTime(now)

			want := lim.AllowN(now, 1)

			_, before := layerCounts(t, h, "ip")
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = "203.0.113.50:1"
			h.ServeHTTP(httptest.NewRecorder(), req)
			_, after := layerCounts(t, h, "ip")

			if got := after == before; got != want {
				t.Fatalf("%+v request %d at +%v: tierlimit allows %v, x/time/rate %v", tc, i, now.Sub(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC)), got, want)
			}

			if !want {
				refused++
			}
		}

		if refused < 50 || refused > 1450 {
			t.Fatalf("%+v: %d of 1500 refused: the sequence does not exercise the bucket", tc, refused)
		}
	}
}

// TestTokenBucketWithoutRedis: when Redis cannot be reached, the memory store
// decides with the same bucket, never letting everything through.
func TestTokenBucketWithoutRedis(t *testing.T) {
	m := miniredis.RunT(t)
	addr := m.Addr()
	m.Close()

	cfg := tierlimit.CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.Address = addr
	cfg.Redis.Timeout = "100ms"
	cfg.Redis.DialTimeout = "100ms"
	cfg.Global.Points = 0
	cfg.IP = config.LayerConfig{Points: 2, Duration: "60s", Algorithm: "tokenbucket"}

	h, err := tierlimit.New(context.Background(), http.NotFoundHandler(), cfg, "bucket-down@test")
	if err != nil {
		t.Fatal(err)
	}

	var codes []int

	for i := 0; i < 4; i++ {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "203.0.113.1:1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}

	if codes[0] != 404 || codes[1] != 404 || codes[2] != 429 || codes[3] != 429 {
		t.Fatalf("answers %v, want the bucket of 2 decided in memory", codes)
	}
}
