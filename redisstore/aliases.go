package redisstore

import (
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rule"

	"github.com/tierlimit/tierlimit/limit"
)

// This package names other packages' types and constants through these
// aliases, not qualified: under Yaegi a function that names another
// package's type or constant allocates once more per call for each such name
// (../doc.go: qualified names).

const keyOfConst = rule.KeyOfConst
const keyOfPrincipalElseClient = rule.KeyOfPrincipalElseClient

type charge = rule.Charge
type layer = rule.Layer
type layerStats = rule.Stats
type tally = rule.Tally

type blockedKey = memstore.BlockedKey
type windowStore = memstore.WindowStore

type heldRegistry = lifetime.HeldRegistry

const outageQuiet = events.OutageQuiet
const outageStale = events.OutageStale

type redisEvent = events.RedisEvent
type redisOutage = events.RedisOutage

const algSliding = limit.Sliding
const algTokenBucket = limit.TokenBucket
const algConcurrency = limit.Concurrency
