package tierlimit

import (
	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"

	"github.com/tierlimit/tierlimit/limit"
)

// The request path names other packages' types and constants through these
// aliases, not qualified: under Yaegi a function that names another
// package's type or constant allocates once more per call for each such name
// (doc.go: qualified names). Code off the request path (building an
// instance, the status page, resets, the registries) names them qualified.

const keyOfClient = rule.KeyOfClient
const keyOfConst = rule.KeyOfConst

type charge = rule.Charge
type layer = rule.Layer
type tally = rule.Tally
type entry = counter.Entry

const nsPerMillisecond = redisstore.NsPerMillisecond

type syncCounter = redisstore.SyncCounter

const algTokenBucket = limit.TokenBucket
const algConcurrency = limit.Concurrency
