package redisresp

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
)

// Script is a Lua script run with EVALSHA, falling back to EVAL (which also
// caches it on the server) when the server answers NOSCRIPT.
type Script struct {
	src string
	sha string
}

// NewScript computes the script's SHA1 locally; it does no I/O.
func NewScript(src string) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{src: src, sha: hex.EncodeToString(sum[:])}
}

// Run runs the script with keys and args. A script error is a Value of KindError.
func (s *Script) Run(p *Pool, keys, args []string) (Value, error) {
	cmd := make([]string, 0, 3+len(keys)+len(args))
	cmd = append(cmd, "EVALSHA", s.sha, strconv.Itoa(len(keys)))
	cmd = append(cmd, keys...)
	cmd = append(cmd, args...)

	v, err := p.Do(cmd...)
	if err != nil || !v.IsError() || !strings.HasPrefix(v.Str, "NOSCRIPT") {
		return v, err
	}

	cmd[0], cmd[1] = "EVAL", s.src

	return p.Do(cmd...)
}

// RunInts runs a script that returns an array of integers, with numKeys keys,
// the keys and arguments given already encoded as bulk strings (see Bulk),
// nargs of them in all. It sends EVALSHA, and EVAL when the server answers
// NOSCRIPT, and returns the integers or the server's error text (a script
// error), without building Values: under Yaegi that is most of a call's cost.
func (s *Script) RunInts(p *Pool, numKeys, nargs int, encoded string) ([]int64, string, error) {
	return s.Call(numKeys, nargs).RunInts(p, encoded)
}

// Call is a script call's encoded head for a number of keys and arguments,
// built once (Script.Call) for calls of that shape.
type Call struct {
	evalsha, eval string
}

// Call returns the head of calls with numKeys keys and nargs keys and
// arguments in all.
func (s *Script) Call(numKeys, nargs int) Call {
	count := "*" + strconv.Itoa(3+nargs) + "\r\n"
	keys := Bulk(strconv.Itoa(numKeys))

	return Call{evalsha: count + "$7\r\nEVALSHA\r\n" + Bulk(s.sha) + keys, eval: count + "$4\r\nEVAL\r\n" + Bulk(s.src) + keys}
}

// Head is the encoded start of the call's EVALSHA command, for ScriptInts.
func (c Call) Head() string {
	return c.evalsha
}

// RunInts is Script.RunInts with the head built beforehand.
func (c Call) RunInts(p *Pool, encoded string) ([]int64, string, error) {
	ints, serverErr, err := p.DoInts(c.evalsha + encoded)
	if err != nil || serverErr == "" || !strings.HasPrefix(serverErr, "NOSCRIPT") {
		return ints, serverErr, err
	}

	return p.DoInts(c.eval + encoded)
}

// RunIntsOn is RunInts on any Client: a Pool, or a Sentinel's primary.
func (c Call) RunIntsOn(p Client, encoded string) ([]int64, string, error) {
	ints, serverErr, err := p.DoInts(c.evalsha + encoded)
	if err != nil || serverErr == "" || !strings.HasPrefix(serverErr, "NOSCRIPT") {
		return ints, serverErr, err
	}

	return p.DoInts(c.eval + encoded)
}
