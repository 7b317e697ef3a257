package config

import (
	"net/netip"
	"testing"
	"time"
)

func TestDurations(t *testing.T) {
	for raw, want := range map[string]time.Duration{
		"1s": time.Second, "60s": time.Minute, "60": time.Minute, " 5 ": 5 * time.Second,
		"500ms": 500 * time.Millisecond, "1h": time.Hour, "1.5s": 1500 * time.Millisecond,
	} {
		got, err := ParseDuration(raw)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %s, %v; want %s", raw, got, err, want)
		}
	}
}

// A bare number of seconds is a duration, decimals included: Traefik's file
// provider hands `duration: 1.5` over as "1.500000", Kubernetes as "1.5".
func TestBareDecimalSecondsAreDurations(t *testing.T) {
	for raw, want := range map[string]time.Duration{
		"1.5": 1500 * time.Millisecond, "1.500000": 1500 * time.Millisecond, " 0.25 ": 250 * time.Millisecond,
		"2.000000": 2 * time.Second, "1.": time.Second, "0.0015": time.Millisecond,
	} {
		got, err := ParseDuration(raw)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %s, %v; want %s", raw, got, err, want)
		}
	}

	for _, raw := range []string{"1.5.0", ".", "1,5", "-1.5", "1e3", "0x10", "Inf"} {
		if d, err := ParseDuration(raw); err == nil {
			t.Errorf("ParseDuration(%q) = %s, want an error", raw, d)
		}
	}
}

func TestMappedProxyPrefixMatchesIPv4(t *testing.T) {
	p, err := ParsePrefix("::ffff:10.0.0.0/104")
	if err != nil {
		t.Fatal(err)
	}

	if p != netip.MustParsePrefix("10.0.0.0/8") {
		t.Fatalf("got %s, want 10.0.0.0/8", p)
	}
}

// TestATopLevelDryRunLeasesAFormerMaxDelayRule: the top-level dryRun makes
// every rule refuse nothing, so a rule's maxDelay waits for nothing; what
// the maxDelay asked of the stores goes with it: synced counters lease the
// rule again (Unleased), memory takes it as its algorithm does (Apart). A
// concurrency rule stays unleased: a slot is never leased.
func TestATopLevelDryRunLeasesAFormerMaxDelayRule(t *testing.T) {
	for _, dry := range []bool{false, true} {
		cfg := Defaults()
		cfg.DryRun = dry
		cfg.Store = StoreRedis
		cfg.Redis.Address = "127.0.0.1:6379"
		cfg.Redis.SyncInterval = "1s"
		cfg.IP = LayerConfig{Points: 2, Duration: "1m", MaxDelay: "10s"}
		cfg.Global = LayerConfig{Points: 5, Algorithm: "concurrency"}

		s, err := Parse(cfg)
		if err != nil {
			t.Fatal(err)
		}

		ip, global := s.Spec("ip"), s.Spec("global")
		if want := !dry; ip.Unleased != want || ip.Apart != want || (ip.MaxDelay != 0) != want {
			t.Errorf("dryRun %v: ip's maxDelay %d, unleased %v, apart %v; want a maxDelay, unleased and apart: %v", dry, ip.MaxDelay, ip.Unleased, ip.Apart, want)
		}

		if !global.Unleased {
			t.Errorf("dryRun %v: the concurrency rule is leased", dry)
		}
	}
}
