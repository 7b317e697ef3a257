package memstore

import (
	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// This package names other packages' types and constants through these
// aliases, not qualified: under Yaegi a function that names another
// package's type or constant allocates once more per call for each such name
// (../doc.go: qualified names).

const keyOfConst = rule.KeyOfConst

type charge = rule.Charge
type layer = rule.Layer
type layerStats = rule.Stats
type tally = rule.Tally
type entry = counter.Entry
type entryList = counter.List

const algSliding = limit.Sliding
const algTokenBucket = limit.TokenBucket
const algConcurrency = limit.Concurrency
