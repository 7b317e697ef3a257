package redisstore

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"

	"github.com/tierlimit/tierlimit/redisresp"
)

// Why Redis failed, in one word an operator can act on: the reason of
// REDIS_UNAVAILABLE and of the status page's redisFallbackReason. The table
// of docs/redis.md ("Redis states") says what each means and what to do.

// serverReasons are the error replies of a Redis that answers but refuses
// the write a request needs, by the reply's code.
var serverReasons = []struct{ code, reason string }{
	{"READONLY", "readonly"},     // a replica: a primary demoted by a failover
	{"OOM", "oom"},               // maxmemory reached with noeviction
	{"MISCONF", "misconf"},       // a failed RDB save with stop-writes-on-bgsave-error
	{"MASTERDOWN", "masterdown"}, // a replica that lost its primary, replica-serve-stale-data no
	{"LOADING", "loading"},       // loading its data set (a restart)
	{"BUSY", "busy"},             // running a long script or function
	{"NOPERM", "noperm"},         // the ACL user lacks a command or key
	{"NOAUTH", "auth"},           // a password is needed
	{"WRONGPASS", "auth"},        // the username or password is wrong
	{"CLUSTERDOWN", "clusterdown"},
}

// Reason is err's reason: a server's refusal by its code, else how the
// connection failed (timeout, refused, closed, tls, unreachable), noprimary
// (no sentinel named a primary, or the one named is not), else
// script (another error reply of a script) or reply (a reply the script does
// not give), error when nothing tells.
func Reason(err error) string {
	if err == nil {
		return ""
	}

	msg := err.Error()
	for _, r := range serverReasons {
		if strings.HasPrefix(msg, r.code+" ") || strings.Contains(msg, ": "+r.code+" ") {
			return r.reason
		}
	}

	return connReason(err, msg)
}

// connReason is Reason for an error that no server code names.
func connReason(err error, msg string) string {
	var netErr net.Error
	var opErr *net.OpError

	switch {
	case errors.Is(err, redisresp.ErrNoPrimary) || errors.Is(err, redisresp.ErrNotPrimary):
		return "noprimary"
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) || strings.Contains(msg, "i/o timeout"):
		return "timeout"
	case strings.Contains(msg, "connection refused"):
		return "refused"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || strings.HasSuffix(msg, "EOF") || strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe"):
		return "closed"
	case strings.Contains(msg, "tls: ") || strings.Contains(msg, "x509: "):
		return "tls"
	case errors.As(err, &opErr):
		return "unreachable"
	case errors.Is(err, ErrBadReply) || errors.Is(err, redisresp.ErrUnexpected) || errors.Is(err, redisresp.ErrProtocol):
		return "reply"
	case errors.Is(err, redisresp.ErrServer) || strings.Contains(msg, " script: "):
		return "script"
	}

	return "error"
}
