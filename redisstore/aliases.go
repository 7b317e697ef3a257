package redisstore

import (
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/rule"

	"github.com/tierlimit/tierlimit/limit"
)

// This package names other packages' constants through these, not
// qualified: under Yaegi a function that names another package's constant
// allocates once more per call for each such name (../doc.go: qualified
// names).

const keyOfConst = rule.KeyOfConst
const keyOfPrincipalElseClient = rule.KeyOfPrincipalElseClient

const outageQuiet = events.OutageQuiet
const outageStale = events.OutageStale

const algFixed = int(limit.Fixed)
const algSliding = int(limit.Sliding)
const algTokenBucket = int(limit.TokenBucket)
const algConcurrency = int(limit.Concurrency)
