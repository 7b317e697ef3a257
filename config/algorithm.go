package config

import "github.com/tierlimit/tierlimit/limit"

// algorithmNames are the configuration's names of the algorithms
// (algorithm:), in limit.Algorithm's order.
var algorithmNames = []string{limit.Fixed: "fixed", limit.Sliding: "sliding", limit.TokenBucket: "tokenbucket", limit.Concurrency: "concurrency"}

// algorithmNamed is the algorithm of a configuration's name ("": fixed).
func algorithmNamed(name string) (limit.Algorithm, bool) {
	if name == "" {
		return limit.Fixed, true
	}

	for a, n := range algorithmNames {
		if n == name {
			return limit.Algorithm(a), true
		}
	}

	return limit.Fixed, false
}

// AlgorithmName is a's name in the configuration, as the status page shows it.
func AlgorithmName(a limit.Algorithm) string {
	return algorithmNames[a]
}
