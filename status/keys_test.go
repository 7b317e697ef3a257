package status

import (
	"math/rand"
	"sort"
	"strconv"
	"testing"

	"github.com/tierlimit/tierlimit/rule"
)

// firstSorted's one-pass selection of a page near the top agrees with a full
// sort, ties included.
func TestFirstSortedAgreesWithAFullSort(t *testing.T) {
	layers := []*rule.Layer{{Limits: rule.Limits{Name: "ip"}}, {Limits: rule.Limits{Name: "global"}}, {Limits: rule.Limits{Name: "a_route"}}}
	rng := rand.New(rand.NewSource(1))

	for round := 0; round < 50; round++ {
		entries := make([]liveKey, rng.Intn(300))
		for i := range entries {
			entries[i] = liveKey{layer: rng.Intn(3), key: strconv.Itoa(rng.Intn(50)), count: int64(rng.Intn(8))}
		}

		want := append([]liveKey(nil), entries...)
		sort.SliceStable(want, func(i, j int) bool { return before(layers, want[i], want[j]) })

		for _, n := range []int{0, 1, 3, 10, 40, 74, 75, 200, 1000} {
			got := firstSorted(layers, append([]liveKey(nil), entries...), n)

			k := n
			if k > len(want) {
				k = len(want)
			}

			if len(got) != k {
				t.Fatalf("round %d, n %d: %d entries, want %d", round, n, len(got), k)
			}

			for i := range got {
				// Equal entries (same layer, key and count) are interchangeable.
				if before(layers, got[i], want[i]) || before(layers, want[i], got[i]) {
					t.Fatalf("round %d, n %d, position %d: %+v, want %+v", round, n, i, got[i], want[i])
				}
			}
		}
	}
}
