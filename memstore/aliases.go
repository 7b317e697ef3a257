package memstore

import (
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// This package names other packages' constants through these, not
// qualified: under Yaegi a function that names another package's constant
// allocates once more per call for each such name (../doc.go: qualified
// names).

const keyOfConst = rule.KeyOfConst

const algSliding = int(limit.Sliding)
const algTokenBucket = int(limit.TokenBucket)
const algConcurrency = int(limit.Concurrency)
