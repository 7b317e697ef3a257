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
// the milliseconds left to the period's end (at least 1), and when that end
// is within the layer's maxDelay, its algorithm names the next period.
func calendarArgs(l *rule.Layer, now int64) string {
	_, end := limit.Period(now, l.Calendar, l.UtcOffset)
	ms := (end - now) / int64(time.Millisecond)
	if ms < 1 {
		ms = 1
	}

	tail := l.RedisTail
	if limit.Within(end-now, l.MaxDelay) {
		tail = nextPeriodTail(l, end)
	}

	return redisresp.Bulk(strconv.FormatInt(l.Capacity, 10)) + redisresp.Bulk(strconv.FormatInt(ms, 10)) + tail
}

// nextPeriodTail is l's RedisTail with the period that starts at end named
// after its algorithm's maxDelay (takeScript's "w<ms>n<start>:<length>"):
// its start in Unix seconds, its key's suffix, and its length in
// milliseconds.
func nextPeriodTail(l *rule.Layer, end int64) string {
	_, after := limit.Period(end, l.Calendar, l.UtcOffset)
	j := strings.Index(l.RedisTail, "\r\n")
	size, _ := strconv.Atoi(l.RedisTail[1:j])
	algorithm := l.RedisTail[j+2 : j+2+size]

	return redisresp.Bulk(algorithm+"n"+calendarSuffix(l, end)[1:]+":"+strconv.FormatInt((after-end)/int64(time.Millisecond), 10)) + l.RedisTail[j+2+size+2:]
}

// calendarAt is the moment whose period a calendar layer l of c counts in:
// c.Now, or the end of its period when a maxDelay reserved c's place in the
// next one (rule.Charge.Ahead), where c's give-backs then go.
func calendarAt(c *rule.Charge, l *rule.Layer) int64 {
	if l.MaxDelay == 0 {
		return c.Now
	}

	for up := c; up != nil; up = up.Parent {
		for _, x := range up.Ahead {
			if x == l {
				_, end := limit.Period(c.Now, l.Calendar, l.UtcOffset)
				return end
			}
		}
	}

	return c.Now
}

// noteAhead records on c's first charge (calendarAt) each calendar layer
// whose place the script reserved in its next period: its reset in the
// reply ints, count and milliseconds to reset per layer, is past its
// period's end.
func noteAhead(c *rule.Charge, ints []int64) {
	top := c
	for top.Parent != nil {
		top = top.Parent
	}

	for i, l := range c.Layers {
		if l.Calendar == 0 || l.MaxDelay == 0 || 2*i+1 >= len(ints) {
			continue
		}

		_, end := limit.Period(c.Now, l.Calendar, l.UtcOffset)
		if ints[2*i+1]*NsPerMillisecond > end-c.Now {
			top.Ahead = append(top.Ahead, l)
		}
	}
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
