package events

import (
	"encoding/json"
	"time"
)

// reminderEvery bounds the REDIS_UNAVAILABLE lines of one outage: the first
// failure writes one, and while probes keep failing one more at most this
// often, so that a long outage stays visible without flooding the log.
const reminderEvery = int64(time.Minute)

// What OutageFailed makes of a failed call.
const (
	OutageStale    = -1 // it reports an outage that already ended: ignore it
	OutageQuiet    = 0  // part of the outage under way: nothing to write
	OutageStarts   = 1  // a new outage: write REDIS_UNAVAILABLE
	OutageReminder = 2  // still down a minute after the last line: write it again
)

// RedisOutage decides the REDIS_UNAVAILABLE and REDIS_RECOVERED lines of a
// backend, so that an outage writes one of each however many requests race
// it: calls in flight when Redis fails or recovers finish on either side of
// the transition, and each would otherwise log its own. The backend holds it
// under its mutex; times are the calls' start, Unix nanoseconds.
type RedisOutage struct {
	down     bool
	ended    int64 // start of the probe that ended the last outage
	lastLine int64 // when the last REDIS_UNAVAILABLE line was written
}

// OutageFailed records a call that started at now and failed; probe says it
// was the back-off's probe.
func OutageFailed(o *RedisOutage, now int64, probe bool) int {
	if !o.down {
		// Started before the probe that ended the last outage: that
		// outage's news, not a new one.
		if now < o.ended {
			return OutageStale
		}

		o.down = true
		o.lastLine = now

		return OutageStarts
	}

	if probe && now-o.lastLine >= reminderEvery {
		o.lastLine = now
		return OutageReminder
	}

	return OutageQuiet
}

// OutageSucceeded records a call that started at now and succeeded, and
// reports whether it ends the outage (then REDIS_RECOVERED is written). Only
// the back-off's probe does: a call that was in flight when Redis failed may
// still succeed after the failure was recorded, and says nothing of Redis now.
func OutageSucceeded(o *RedisOutage, now int64, probe bool) bool {
	if !o.down || !probe {
		return false
	}

	o.down = false
	o.ended = now

	return true
}

// RedisEvent is a Redis event line: its time first, set when it is written
// (RedisEventLine).
type RedisEvent struct {
	Time     string `json:"time"`
	Event    string `json:"event"`
	Severity string `json:"severity"`
	Address  string `json:"address"`
	Primary  string `json:"primary,omitempty"`
	Previous string `json:"previous,omitempty"`
	Reason   string `json:"reason,omitempty"` // why Redis failed, in one word (redisstore.Reason)
	Error    string `json:"error,omitempty"`
	Fallback string `json:"fallback,omitempty"`
	RetryIn  string `json:"retryIn,omitempty"`
}

// RedisEventLine returns the JSON line of ev at now (Unix nanoseconds), newline
// included.
func RedisEventLine(ev RedisEvent, now int64) ([]byte, error) {
	ev.Time = EventTime(now)

	line, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}

	return append(line, '\n'), nil
}
