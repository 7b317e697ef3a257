package tierlimit

import (
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"

	"github.com/tierlimit/tierlimit/limit"
)

// The request path names other packages' constants through these, not
// qualified: under Yaegi a function that names another package's constant
// allocates once more per call for each such name (doc.go: qualified
// names). Code off the request path (building an instance, the status page,
// resets, the registries) names them qualified.

const keyOfClient = rule.KeyOfClient
const keyOfConst = rule.KeyOfConst

const nsPerMillisecond = redisstore.NsPerMillisecond

const algTokenBucket = int(limit.TokenBucket)
const algConcurrency = int(limit.Concurrency)
