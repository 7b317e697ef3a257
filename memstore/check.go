package memstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// A check-only layer (a countStatus route's, before its response) is
// evaluated by checkLayer and its per-algorithm forms (take_gen.go, from
// ../paths.tmpl, where limit's comparisons are written out).

// checkRefused records a refusal of a check-only layer (window w, or nil
// when the key has none) at this count and reset, and reports whether it
// refuses the request (not in dry run). The reset is formatted unless it
// is in the second w's is.
func checkRefused(t *rule.Tally, i int, l *rule.Layer, w *counter.Entry, count, reset int64) bool {
	l.Stats.Refused++

	first := false
	var resetH []string
	if w != nil {
		w.Refused++
		first = !w.Logged
		w.Logged = true
		if w.ResetH != nil && w.ResetSec == limit.CeilSeconds(reset) {
			resetH = w.ResetH
		}
	}

	if resetH == nil {
		resetH = []string{strconv.FormatInt(limit.CeilSeconds(reset), 10)}
	}

	return rule.RefuseAs(t, i, l, count, reset, resetH, first)
}
