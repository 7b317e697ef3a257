package redisstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rule"
)

// The Redis store's memory fallback decides while Redis cannot. It starts
// each key from what Redis last reported of it to this process, not from
// zero: a key that Redis had at 290 of 300 when it failed gets 10 more from
// memory, not 300. What remains is the bound docs/redis.md states: requests
// in flight when Redis failed, the other replicas' requests since a key was
// last reported here, and, for keys Redis never reported to this process,
// up to their points per replica.

// Remember sets the memory counter of key in l to what Redis reported for
// it after charging a request: count points in use and the reset (Unix
// nanoseconds: a fixed or sliding window's end, a token bucket's full time).
// A sliding counter takes the estimate as its current window's count, with
// none before it: memory then refuses no later than Redis would. It returns
// the counter's X-RateLimit-Reset value.
func Remember(s *memstore.WindowStore, l *rule.Layer, key string, count, reset, now int64) []string {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	// A counter remembered is held like one charged (WindowStore.Takes), so
	// that the next one remembered cannot evict it.
	s.Takes++

	w := l.Entries[key]
	if w == nil || w.List != l.List || w.Expire <= now {
		w = s.Restart(now, l, w, key)
	}

	w.Count = count
	w.Taken = s.Takes

	w.Expire = reset
	if l.Alg == algSliding {
		w.PrevCount = 0
		w.Start = reset - l.Duration
		w.Expire = w.Start + l.List.Span
	}

	if w.Reset != reset {
		w.Reset = reset
		if secs := limit.CeilSeconds(reset); secs != w.ResetSec {
			w.ResetSec = secs
			w.ResetH = []string{strconv.FormatInt(secs, 10)}
		}
	}

	return w.ResetH
}

// rememberPlaces follows rememberAll (Record) for a request that Redis
// allowed to wait for its place (recordOdd): each fixed or calendar layer
// with a maxDelay is remembered with the start of the window that ends at
// its reset. The window Redis charged is a later one when it reserved the
// place there (the next window or period, Redis holding the current one
// full), which memory then counts as its own next window (memstore's delay:
// a request waits for its start); without it the fallback would admit at
// once what Redis would have made wait.
func rememberPlaces(s *memstore.WindowStore, c *rule.Charge, ints []int64) {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	for i := 0; 2*i+1 < len(ints) && i < len(c.Layers); i++ {
		l := c.Layers[i]
		if l.MaxDelay == 0 || l.Alg != algFixed {
			continue
		}

		w := l.Entries[c.Keys[i]]
		if w == nil || w.List != l.List {
			continue
		}

		reset := c.Now + ints[2*i+1]*NsPerMillisecond
		if l.Calendar == 0 {
			w.Start = reset - l.Duration
		} else {
			w.Start, _ = limit.Period(reset-1, l.Calendar, l.UtcOffset)
		}
	}
}

// heldPast reports whether Redis holds a request that layer l counts past
// its points: a dry-run fixed window does (TakeScript); a sliding window or
// a token bucket then reports what it would hold, not what it does.
func heldPast(l *rule.Layer) bool {
	return l.DryRun && l.Alg != algSliding && l.Alg != algTokenBucket
}
