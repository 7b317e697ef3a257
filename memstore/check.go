package memstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// checkLayer evaluates the check-only layer l under the store's lock for a
// request of cost points, as Take would charge it, and records it in t as
// layers[i]: a
// refusal like any other, an allowance with the layer's count as it is
// (nothing spent). It writes no count and makes no counter: only refusal
// statistics, and a sliding window's move to its next window, which every
// later charge would make the same.
func checkLayer(t *tally, i int, now int64, l *layer, key string, cost int64) bool {
	w := l.Entries[key]
	if w != nil && w.List != l.List {
		w = nil
	}

	switch {
	case l.Algorithm == algSliding:
		return checkSliding(t, i, now, l, w, cost)
	case l.Algorithm == algTokenBucket:
		return checkBucket(t, i, now, l, w, cost)
	}

	count := int64(0)
	reset := now + l.Duration
	var resetH []string

	if w != nil && w.Reset > now {
		count = w.Count
		reset = w.Reset
		resetH = w.ResetH
	} else {
		w = nil
	}

	if count+cost > l.Points { // !limit.Fits, written out: a call here costs every check (../doc.go: frames)
		return checkRefused(t, i, l, w, count+cost, reset, resetH)
	}

	if resetH == nil {
		resetH = []string{strconv.FormatInt(limit.CeilSeconds(reset), 10)}
	}

	rule.Allow(t, i, l, count, reset, resetH)

	return false
}

// checkSliding is check for a sliding layer (slide's arithmetic).
func checkSliding(t *tally, i int, now int64, l *layer, w *window, cost int64) bool {
	if w == nil || w.Expire <= now {
		reset := now + l.Duration
		rule.Allow(t, i, l, 0, reset, []string{strconv.FormatInt(limit.CeilSeconds(reset), 10)})

		return false
	}

	if w.Reset <= now {
		rotate(w, l, now)
	}

	left := w.Reset - now
	est := limit.SlidingCount(w.PrevCount, w.Count, cost, left, l.Duration)

	if est > l.Points {
		retry := now + limit.SlidingWait(w.PrevCount, w.Count, cost, l.Points, left, l.Duration)
		return checkRefused(t, i, l, w, est, retry, []string{strconv.FormatInt(limit.CeilSeconds(retry), 10)})
	}

	rule.Allow(t, i, l, est-cost, w.Reset, w.ResetH)

	return false
}

// checkBucket is check for a token bucket (drip's arithmetic). An allowed
// take of cost tokens puts cost whole intervals on the TAT, so the tokens in
// use without it are cost fewer than BucketTake's.
func checkBucket(t *tally, i int, now int64, l *layer, w *window, cost int64) bool {
	tat := now
	if w != nil && w.Reset > now {
		tat = w.Reset
	}

	retry, used := limit.BucketTake(tat, now, cost, l.Points, l.Interval)
	if used > l.Points {
		return checkRefused(t, i, l, w, used, retry, []string{strconv.FormatInt(limit.CeilSeconds(retry), 10)})
	}

	rule.Allow(t, i, l, used-cost, tat, []string{strconv.FormatInt(limit.CeilSeconds(tat), 10)})

	return false
}

// checkRefused records a refusal of a check-only layer (window w, or nil
// when the key has none) and reports whether it refuses the request (not
// in dry run).
func checkRefused(t *tally, i int, l *layer, w *window, count, reset int64, resetH []string) bool {
	l.Stats.Refused++

	first := false
	if w != nil {
		w.Refused++
		first = !w.Logged
		w.Logged = true
	}

	if resetH == nil {
		resetH = []string{strconv.FormatInt(limit.CeilSeconds(reset), 10)}
	}

	return rule.RefuseAs(t, i, l, count, reset, resetH, first)
}
