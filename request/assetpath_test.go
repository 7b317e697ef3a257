package request

import (
	"math/rand"
	"strings"
	"testing"
)

// TestAssetHintCoversEveryAsset: AssetHint must match every path whose
// canonical form starts with an asset prefix (else the root's fast path
// would charge such a request to ip, and its general path, by
// CanonicalPath, to assets), and should leave ordinary paths alone.
func TestAssetHintCoversEveryAsset(t *testing.T) {
	pieces := []string{"/", "/", "a", "A", "s", "S", "e", "t", "x", "%", "2", "5", "F", "f", "6", "1", ";", ".", "..", `\`, "\u212a", "é"}
	prefixes := []string{"/assets/", "/static/"}
	rng := rand.New(rand.NewSource(1))

	for _, fold := range []bool{true, false} {
		canonical := make([]string, len(prefixes))
		for i, prefix := range prefixes {
			canonical[i] = CanonicalPattern(prefix, !fold)
		}

		hint := AssetHint(canonical, fold)
		paths := []string{"", "assets/x", "/ASSETS/x", "/assets//x", "//assets/x", "/x/../assets/y", "/%61ssets/x", "/%2561ssets/x", `\assets\x`, "/;p/assets/x", "/static/"}

		for i := 0; i < 200000; i++ {
			var b strings.Builder
			for n := rng.Intn(12); n >= 0; n-- {
				b.WriteString(pieces[rng.Intn(len(pieces))])
			}

			paths = append(paths, b.String(), "/assets/"+b.String(), "/"+b.String()+"assets/")
		}

		for _, p := range paths {
			if HasAnyPrefix(CanonicalPath(p, fold), canonical) && !hint.MatchString(p) {
				t.Fatalf("fold %v: %q is an asset (canonical %q) that assetHint misses", fold, p, CanonicalPath(p, fold))
			}
		}

		for _, p := range []string{"/api/items", "/auth/login", "/users/7/profile", "/assetsx/a.js"} {
			if hint.MatchString(p) {
				t.Errorf("fold %v: assetHint matches %q, which is no asset", fold, p)
			}
		}
	}
}
