package tierlimit

import (
	"strconv"

	"github.com/tierlimit/tierlimit/answer"
)

// The answer itself (headers beyond the tables, Retry-After, the refusal,
// the WebSocket close) is package answer. This file holds the header
// arithmetic of the generated paths (paths.tmpl) and the number formatting
// the root's windows, stores and status page share.

// Constants of the header arithmetic: typed expressions such as
// int64(time.Second) or int64(len(smallInts)) are evaluated per request under
// Yaegi (doc.go: frames).
const (
	nsPerSecond = 1000000000
	maxSmallInt = answer.MaxSmallInt
)

// smallInts are the decimal forms of 0 to maxSmallInt, for header values
// (answer.SmallInts, the same slice).
var smallInts = answer.SmallInts

func formatInt(n int64) string {
	return strconv.FormatInt(n, 10)
}
