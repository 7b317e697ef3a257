package redisstore

import (
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// KeyGrace is how long a key that names its window (a calendar period's,
// or a synced window's, syncstore.go) outlives the window's end on the
// clock of the replica that gave it its TTL, and so how far behind that
// replica another replica's clock may be and still find the count in
// Redis: the scripts never shorten such a key's TTL (takeScript's fixed,
// refundScript, leaseScript), so it lives until the latest end a replica
// gave it plus KeyGrace, whatever the order of the calls (docs/redis.md,
// clocks).
const KeyGrace = 10 * time.Second

// calendarSuffix is what a calendar layer's Redis key ends with at now: the
// period's start in Unix seconds.
func calendarSuffix(l *rule.Layer, now int64) string {
	start, _ := limit.Period(now, l.Calendar, l.UtcOffset)
	return ":" + strconv.FormatInt(start/int64(time.Second), 10)
}

// calendarCall adds a calendar layer's key and arguments to a script call
// (EncodeCall): the key names the period, and the window is the
// milliseconds left to its end (at least 1) on the caller's clock, which the
// script takes for the reset and the key's life, never for whether the key
// is live (another replica's clock, and Redis's, differ).
func calendarCall(l *rule.Layer, keys, args, key string, now int64) (string, string) {
	key = l.RedisKey + key + calendarSuffix(l, now)

	return keys + "$" + strconv.Itoa(len(key)) + "\r\n" + key + "\r\n", args + calendarArgs(l, now)
}

// calendarArgs are a calendar layer's script arguments at now: its window is
// the milliseconds left to the period's end (at least 1).
func calendarArgs(l *rule.Layer, now int64) string {
	_, end := limit.Period(now, l.Calendar, l.UtcOffset)
	ms := (end - now) / int64(time.Millisecond)
	if ms < 1 {
		ms = 1
	}

	return redisresp.Bulk(strconv.FormatInt(l.Capacity, 10)) + redisresp.Bulk(strconv.FormatInt(ms, 10)) + l.RedisTail
}

// RedisTail is a layer's script arguments after its points and window.
func RedisTail(args string) string {
	i := 0
	for n := 0; n < 2; n++ {
		j := strings.Index(args[i:], "\r\n")
		size, _ := strconv.Atoi(args[i+1 : i+j])
		i += j + 2 + size + 2
	}

	return args[i:]
}
