package tierlimit

import (
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

// The root names other packages' types and constants through these
// aliases, not qualified: under Yaegi a function that names another
// package's type or constant allocates once more per call for each such name
// (doc.go: qualified names).

const keyOfClient = rule.KeyOfClient
const keyOfConst = rule.KeyOfConst
const keyOfHeader = rule.KeyOfHeader
const keyOfHost = rule.KeyOfHost
const keyOfPrincipal = rule.KeyOfPrincipal
const keyOfPrincipalElseClient = rule.KeyOfPrincipalElseClient
const maxPrecomputed = rule.MaxPrecomputed

type charge = rule.Charge
type headerTable = rule.HeaderTable
type layer = rule.Layer
type limits = rule.Limits
type monthPolicy = rule.MonthPolicy
type redisEncoding = rule.RedisEncoding
type refusal = rule.Refusal
type tally = rule.Tally
type window = rule.Window

const maxHostKeyLen = memstore.MaxHostKeyLen

type blockedKey = memstore.BlockedKey
type windowStore = memstore.WindowStore

const releaseGrace = lifetime.ReleaseGrace

type heldRegistry = lifetime.HeldRegistry

const outageReminder = events.OutageReminder
const outageStale = events.OutageStale
const outageStarts = events.OutageStarts

type eventLog = events.EventLog
type redisEvent = events.RedisEvent
type redisOutage = events.RedisOutage
type resetReport = events.ResetReport

const minBackoff = redisstore.MinBackoff
const nsPerMillisecond = redisstore.NsPerMillisecond
const redisAbsent = redisstore.RedisAbsent
const redisCleared = redisstore.RedisCleared
const redisUnavailable = redisstore.RedisUnavailable

var takeScript = redisstore.TakeScript

type backendRegistry = redisstore.BackendRegistry
type blockList = redisstore.BlockList
type owedKey = redisstore.OwedKey
type redisBackend = redisstore.RedisBackend
type redisStore = redisstore.RedisStore
type resetForget = redisstore.ResetForget
type syncCounter = redisstore.SyncCounter
type syncState = redisstore.SyncState

const calMonth = limit.Month
const calDay = limit.Day
