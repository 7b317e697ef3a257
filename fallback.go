package tierlimit

import "github.com/tierlimit/tierlimit/limit"

// The Redis store's memory fallback decides while Redis cannot. It starts
// each key from what Redis last reported of it to this process, not from
// zero: a key that Redis had at 290 of 300 when it failed gets 10 more from
// memory, not 300. What remains is the bound docs/redis.md states: requests
// in flight when Redis failed, the other replicas' requests since a key was
// last reported here, and, for keys Redis never reported to this process,
// up to their points per replica.

// remember sets the memory counter of key in l to what Redis reported for
// it after charging a request: count points in use and the reset (Unix
// nanoseconds: a fixed or sliding window's end, a token bucket's full time).
// A sliding counter takes the estimate as its current window's count, with
// none before it: memory then refuses no later than Redis would. It returns
// the counter's X-RateLimit-Reset value.
func remember(s *windowStore, l *layer, key string, count, reset, now int64) []string {
	s.mu.Lock()
	defer s.mu.Unlock()

	// A counter remembered is held like one charged (windowStore.takes), so
	// that the next one remembered cannot evict it.
	s.takes++

	w := l.entries[key]
	if w == nil || w.list != l.list || w.expire <= now {
		w = s.restart(now, l, w, key)
	}

	w.count = count
	w.taken = s.takes

	w.expire = reset
	if l.sliding {
		w.prevCount = 0
		w.start = reset - l.duration
		w.expire = w.start + l.list.span
	}

	if w.reset != reset {
		w.reset = reset
		if secs := limit.CeilSeconds(reset); secs != w.resetSec {
			w.resetSec = secs
			w.resetH = []string{formatInt(secs)}
		}
	}

	return w.resetH
}

// rememberAll is remember for every layer of a request that Redis
// allowed, or charged in a dry run: ints is the script's reply, validated
// (redisStore.record), with each layer's count and milliseconds to reset.
func rememberAll(s *windowStore, c *charge, ints []int64) {
	now := c.now
	for i := 0; 2*i+1 < len(ints) && i < len(c.layers); i++ {
		l := c.layers[i]
		if count := ints[2*i]; count <= l.points || l.dryRun {
			remember(s, l, c.keys[i], count, now+ints[2*i+1]*nsPerMillisecond, now)
		}
	}
}
