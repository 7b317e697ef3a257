package tierlimit

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
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
