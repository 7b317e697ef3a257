package events

import (
	"testing"
	"time"
)

// TestRedisEventLineCarriesTime: a Redis event's line has "time" first, in
// UTC, from the time it is given, and keeps every other field.
func TestRedisEventLineCarriesTime(t *testing.T) {
	line, err := RedisEventLine(RedisEvent{Event: "REDIS_UNAVAILABLE", Severity: "error", Address: "127.0.0.1:6379",
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
	var o RedisOutage

	ms := int64(time.Millisecond)
	lines := 0

	count := func(kind int) {
		if kind == OutageStarts || kind == OutageReminder {
			lines++
		}
	}

	// Calls in flight when Redis fails: the first starts the outage.
	for i := 0; i < 10; i++ {
		count(OutageFailed(&o, t0+int64(i)*ms, false))
	}

	// Calls in flight from before the failure that still succeed say
	// nothing of Redis now.
	for i := 0; i < 5; i++ {
		if OutageSucceeded(&o, t0+int64(i)*ms, false) {
			t.Fatal("a call in flight at the failure ended the outage")
		}
	}

	// Probes fail every 5s for three minutes: one reminder a minute.
	for now := t0 + 200*ms; now < t0+int64(3*time.Minute); now += 5000 * ms {
		count(OutageFailed(&o, now, true))
	}

	if lines != 3 {
		t.Fatalf("%d REDIS_UNAVAILABLE lines for a 3-minute outage, want the first and 2 reminders", lines)
	}

	end := t0 + int64(3*time.Minute)
	if !OutageSucceeded(&o, end, true) {
		t.Fatal("the probe's success did not end the outage")
	}

	if OutageSucceeded(&o, end+ms, true) {
		t.Fatal("the outage ended twice")
	}

	// A call that started before that probe and fails afterwards reports
	// the outage that ended, not a new one.
	if kind := OutageFailed(&o, end-ms, false); kind != OutageStale {
		t.Fatalf("a stale failure: %d, want OutageStale", kind)
	}

	if kind := OutageFailed(&o, end+ms, false); kind != OutageStarts {
		t.Fatalf("a failure after the recovery: %d, want a new outage", kind)
	}
}

var t0 = time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixNano()
