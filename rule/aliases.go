package rule

import "github.com/tierlimit/tierlimit/limit"

// The request path names limit's constants through these aliases, not
// qualified: under Yaegi a function that names another package's type or
// constant allocates once more per call for each such name (../doc.go:
// qualified names).
const algFixed = int(limit.Fixed)
const algConcurrency = int(limit.Concurrency)
