package rule

import "testing"

// TestMergedTallyShowsAsOneTake: the tallies of the two stores merge as one
// take of every layer would report them: the refusing layer shown, else the
// one with the fewest requests left, the first of equals; first-refusal
// bits at the layers' own places.
func TestMergedTallyShowsAsOneTake(t *testing.T) {
	for _, c := range []struct {
		name       string
		mem, red   Tally
		shown      int
		left       int64
		refused    bool
		firstsWant uint64
	}{
		{"fewest left in redis", Tally{Shown: 0, Left: 5}, Tally{Shown: 0, Left: 2}, 1, 2, false, 0},
		{"fewest left in memory", Tally{Shown: 0, Left: 1}, Tally{Shown: 1, Left: 2}, 0, 1, false, 0},
		{"equal: the first", Tally{Shown: 0, Left: 2}, Tally{Shown: 0, Left: 2}, 0, 2, false, 0},
		{"refused in redis", Tally{Shown: 0, Left: 0}, Tally{Shown: 1, Refused: true, Firsts: 2}, 2, 0, true, 4},
		{"dry run: both refuse, the first shown", Tally{Shown: 0, Refused: true, Firsts: 1}, Tally{Shown: 0, Refused: true, Firsts: 1}, 0, 0, true, 3},
		{"nothing in memory", Tally{Shown: -1}, Tally{Shown: 1, Left: 7}, 2, 7, false, 0},
	} {
		// Layer 0 in memory; 1 and 2 in Redis.
		tl := Tally{Shown: -1}
		MergeTally(&tl, &c.mem, []int{0})
		MergeTally(&tl, &c.red, []int{1, 2})

		if tl.Shown != c.shown || tl.Left != c.left || tl.Refused != c.refused || tl.Firsts != c.firstsWant {
			t.Errorf("%s: %+v, want shown %d, left %d, refused %v, firsts %b", c.name, tl, c.shown, c.left, c.refused, c.firstsWant)
		}
	}
}
