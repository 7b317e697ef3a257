package tierlimit

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// eventSink is an event writer that the probing goroutine and the test
// share.
type eventSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *eventSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.buf.Write(p)
}

func (s *eventSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.buf.String()
}

// probing gives h's backend (a test's, made without one) the probing
// goroutine that newBackend gives every backend, and an event sink.
func probing(t *testing.T, h *harness) (*redisBackend, *eventSink) {
	t.Helper()

	b := redisOf(h.p.store).backend
	sink := &eventSink{}
	b.log = sink
	b.probe.done = make(chan struct{})
	t.Cleanup(func() { stopProbe(b) })

	return b, sink
}

// fallbackMetric is h's tierlimit_redis_fallback sample, as /metrics shows
// it.
func fallbackMetric(t *testing.T, h *harness) string {
	t.Helper()

	text := h.p.metricsText(h.clock.Now().UnixNano())
	head := `tierlimit_redis_fallback{middleware="` + h.p.name + `"} `

	i := strings.Index(text, head)
	if i < 0 {
		t.Fatalf("no %s sample in\n%s", head, text)
	}

	rest := text[i+len(head):]

	return rest[:strings.IndexByte(rest, '\n')]
}

// waitFor polls cond, the outcome of a background call (the probe, the
// payment), for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()

	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}

		time.Sleep(10 * time.Millisecond) // polling a background call, not a window
	}
}

// TestRecoveryIsSeenWithoutTraffic: after an outage, an instance that
// receives no request reports Redis's recovery: the probe on the back-off's
// schedule finds Redis up, the metric goes back to 0 with one
// REDIS_RECOVERED (written before the metric moves, so that whoever sees the
// 0 finds the event), and the outage's charges are paid into Redis. While
// Redis is still away, the probes fail and the metric stays 1.
func TestRecoveryIsSeenWithoutTraffic(t *testing.T) {
	f := newFlap(t, "fixed", "203.0.113.21")
	h, proxy, admin, send := f.h, f.proxy, f.admin, f.send
	b, events := probing(t, h)
	key := h.p.layers[0].redisKey + f.client

	send(4)
	proxy.cut()
	send(3)

	if got := fallbackMetric(t, h); got != "1" || strings.Count(events.String(), "REDIS_UNAVAILABLE") != 1 {
		t.Fatalf("during the outage: metric %s, events\n%s", got, events.String())
	}

	// Two probes fail (200 ms, then 400 ms): still down, nothing recovered.
	waitFor(t, "two failed probes", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()

		return b.backoff >= 4*minBackoff
	})

	if got := fallbackMetric(t, h); got != "1" || strings.Contains(events.String(), "REDIS_RECOVERED") {
		t.Fatalf("Redis still cut: metric %s, events\n%s", got, events.String())
	}

	proxy.restore()

	waitFor(t, "the metric to go back to 0", func() bool { return fallbackMetric(t, h) == "0" })

	out := events.String()
	if strings.Count(out, "REDIS_RECOVERED") != 1 || strings.Index(out, "REDIS_RECOVERED") < strings.Index(out, "REDIS_UNAVAILABLE") {
		t.Fatalf("the metric is 0; want one REDIS_RECOVERED after the REDIS_UNAVAILABLE, already written:\n%s", out)
	}

	waitFor(t, "the outage's 3 in Redis", func() bool { return redisDo(t, admin, "GET", key).Str == "7" })

	if f.allowed != 7 || h.calls.Load() != 7 {
		t.Fatalf("%d allowed, %d served: the test sent traffic after the outage", f.allowed, h.calls.Load())
	}
}

// TestTheProbeStopsWithTheBackend: a released backend's probe ends, and a
// backend's next failure starts another once it ended.
func TestTheProbeStopsWithTheBackend(t *testing.T) {
	h, _ := redisHarness(t, closedPort(t), nil)
	b, _ := probing(t, h)

	h.get("/api", "203.0.113.22:1")

	running := func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()

		return b.probe.running
	}

	if !running() {
		t.Fatal("no probe after a failure")
	}

	closeBackend(b)
	waitFor(t, "the probe to end", func() bool { return !running() })

	if b.failed(h.clock.Now().UnixNano()+int64(time.Minute), true, errBadReply); running() {
		t.Fatal("a released backend started a probe")
	}
}
