package memstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// Spend charges cost to each of c's layers whatever its points: the part
// of a response's cost beyond what its request reserved (../meter.go). It
// may take a layer past its points, which then refuses until its window
// has room again; a token bucket repays the debt as it refills. A window
// that has ended is started anew with the charge.
func Spend(s *WindowStore, c *rule.Charge, cost int64) {
	now := c.Now

	s.Mu.Lock()
	s.Takes++

	for i, l := range c.Layers {
		key := c.Keys[i]
		w := l.Entries[key]

		switch {
		case l.CheckOnly:
		case l.Alg == algTokenBucket:
			spendBucket(s, l, key, now, cost)
		case l.Alg == algSliding:
			slidingAt(s, l, key, now).Count += cost
		default:
			if w == nil || w.Reset <= now || w.List != l.List {
				w = s.Restart(now, l, w, key)
			}

			w.Count += cost
		}
	}

	s.Mu.Unlock()
}

// spendBucket charges token bucket l's key cost tokens whatever its burst
// (limit.BucketSpend). Called with s.mu held.
func spendBucket(s *WindowStore, l *rule.Layer, key string, now, cost int64) {
	w := bucketAt(s, l, key, now)
	tat, used := limit.BucketSpend(w.Reset, now, cost, l.Interval)
	w.Reset = tat
	w.Count = used
	w.Expire = tat
	w.ResetSec = limit.CeilSeconds(w.Reset)
	w.ResetH = []string{strconv.FormatInt(w.ResetSec, 10)}
}
