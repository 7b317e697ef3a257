package tierlimit

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/events"
)

// TestRateLimitEventCarriesTime: a refusal's line has "time", RFC 3339 in
// UTC, from the event log's clock (here a clock in another zone).
func TestRateLimitEventCarriesTime(t *testing.T) {
	h := newHarness(t, onlyIP(1, "1s"))

	zone := time.FixedZone("UTC+2", 2*3600)
	at := time.Date(2026, 6, 15, 12, 0, 0, 250e6, zone)
	h.p.events.Now = func() time.Time { return at }

	h.get("/", "203.0.113.9:1")
	h.get("/", "203.0.113.9:1")

	line := strings.TrimSpace(h.events.String())

	var ev map[string]string
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatalf("event %q: %v", line, err)
	}

	if ev["event"] != "RATE_LIMIT_TRIGGERED" || ev["time"] != "2026-06-15T10:00:00.250Z" {
		t.Fatalf("event %q: want RATE_LIMIT_TRIGGERED at 2026-06-15T10:00:00.250Z", line)
	}

	if _, err := time.Parse(time.RFC3339, ev["time"]); err != nil {
		t.Fatalf("time %q is not RFC 3339: %v", ev["time"], err)
	}
}

// TestRedisEventLineCarriesTime: a Redis event's line has "time" first, in
// UTC, from the time it is given, and keeps every other field.
func TestRedisEventLineCarriesTime(t *testing.T) {
	line, err := events.RedisEventLine(redisEvent{Event: "REDIS_UNAVAILABLE", Severity: "error", Address: "127.0.0.1:6379",
		Error: "boom", Fallback: "memory", RetryIn: "200ms"}, t0+int64(5*time.Millisecond))
	if err != nil {
		t.Fatalf("redisEventLine: %v", err)
	}

	want := `{"time":"2026-06-15T10:00:00.005Z","event":"REDIS_UNAVAILABLE","severity":"error","address":"127.0.0.1:6379",` +
		`"error":"boom","fallback":"memory","retryIn":"200ms"}` + "\n"
	if string(line) != want {
		t.Fatalf("line\n%s want\n%s", line, want)
	}
}

// TestOutageIsOneEvent: calls racing an outage's start and end write one
// REDIS_UNAVAILABLE and one REDIS_RECOVERED, and a long outage one reminder a
// minute at most.
func TestOutageIsOneEvent(t *testing.T) {
	var o redisOutage

	ms := int64(time.Millisecond)
	lines := 0

	count := func(kind int) {
		if kind == outageStarts || kind == outageReminder {
			lines++
		}
	}

	// Calls in flight when Redis fails: the first starts the outage.
	for i := 0; i < 10; i++ {
		count(events.OutageFailed(&o, t0+int64(i)*ms, false))
	}

	// Calls in flight from before the failure that still succeed say
	// nothing of Redis now.
	for i := 0; i < 5; i++ {
		if events.OutageSucceeded(&o, t0+int64(i)*ms, false) {
			t.Fatal("a call in flight at the failure ended the outage")
		}
	}

	// Probes fail every 5s for three minutes: one reminder a minute.
	for now := t0 + 200*ms; now < t0+int64(3*time.Minute); now += 5000 * ms {
		count(events.OutageFailed(&o, now, true))
	}

	if lines != 3 {
		t.Fatalf("%d REDIS_UNAVAILABLE lines for a 3-minute outage, want the first and 2 reminders", lines)
	}

	end := t0 + int64(3*time.Minute)
	if !events.OutageSucceeded(&o, end, true) {
		t.Fatal("the probe's success did not end the outage")
	}

	if events.OutageSucceeded(&o, end+ms, true) {
		t.Fatal("the outage ended twice")
	}

	// A call that started before that probe and fails afterwards reports
	// the outage that ended, not a new one.
	if kind := events.OutageFailed(&o, end-ms, false); kind != outageStale {
		t.Fatalf("a stale failure: %d, want outageStale", kind)
	}

	if kind := events.OutageFailed(&o, end+ms, false); kind != outageStarts {
		t.Fatalf("a failure after the recovery: %d, want a new outage", kind)
	}
}
