package config

import (
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/limit"
)

// checkSync reads redis.syncInterval into s.syncInterval: a duration, with
// fixed windows only among the layers it leases (sliding windows and token
// buckets are decided by Redis's clock and state, block durations by a
// block key).
func checkSync(raw string, s *Settings) error {
	trimmed := strings.TrimSpace(raw)
	if trimmed == "" || trimmed == "0" {
		return nil
	}

	if strings.HasPrefix(trimmed, "-") {
		return invalid("redis.syncInterval", raw, "must be >= 0 (0: one script call per request)")
	}

	if zero, err := time.ParseDuration(trimmed); err == nil && zero == 0 {
		return nil
	}

	d, err := ParseDuration(raw)
	if err != nil {
		return invalid("redis.syncInterval", durationText(raw), err.Error())
	}

	s.SyncInterval = d
	if d == 0 || s.Store != "redis" {
		return nil
	}

	// A layer synced counting does not lease (Unleased: concurrency, a
	// maxDelay) is counted by the script as exact counting does, whatever
	// its algorithm.
	for _, l := range Rules(s) {
		if !l.On() || l.Unleased {
			continue
		}

		why := ""
		switch {
		case l.Algorithm == limit.Sliding:
			why = `algorithm "sliding"`
		case l.Algorithm == limit.TokenBucket:
			why = `algorithm "tokenbucket"`
		case l.BlockDuration != 0:
			why = "a blockDuration"
		}

		if why != "" {
			return invalid("redis.syncInterval", raw, "syncs fixed windows only, and layer "+strconv.Quote(l.Name)+" has "+why+"; use syncInterval 0 (one script call per request) or a fixed window")
		}
	}

	return nil
}
