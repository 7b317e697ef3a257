package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/tierlimit/tierlimit/redisresp"
)

// redis.*: the Redis deployment (one server, Sentinel or Cluster), its
// timeouts and pool, and redis.tls, parsed into redisresp.Options.

// checkRedis reads redis.* into s.redis.
func checkRedis(rc RedisConfig, s *Settings) error {
	var err error

	s.Redis = redisresp.Options{
		Address: rc.Address, Username: rc.Username, Password: rc.Password,
		DB: rc.DB, PoolSize: rc.PoolSize,
	}

	if err = parseTLS(rc.TLS, &s.Redis); err != nil {
		return err
	}

	if s.Redis.DialTimeout, err = ParseDuration(rc.DialTimeout); err != nil {
		return invalid("redis.dialTimeout", durationText(rc.DialTimeout), err.Error())
	}

	if s.Redis.Timeout, err = ParseDuration(rc.Timeout); err != nil {
		return invalid("redis.timeout", durationText(rc.Timeout), err.Error())
	}

	if rc.DB < 0 {
		return invalid("redis.db", rc.DB, "must be >= 0")
	}

	if rc.PoolSize < 1 {
		return invalid("redis.poolSize", rc.PoolSize, "must be >= 1")
	}

	return checkDeployment(rc, s)
}

// checkDeployment reads which of redis.address, redis.sentinel and
// redis.cluster is used: exactly one.
func checkDeployment(rc RedisConfig, s *Settings) error {
	address := rc.Address
	if address == defaultRedisAddress && (rc.Sentinel != nil || rc.Cluster != nil) {
		address = ""
	}

	switch {
	case rc.Sentinel != nil && rc.Cluster != nil:
		return invalid("redis.cluster", strings.Join(rc.Cluster.Addresses, ","), "cannot be set together with redis.sentinel; use one of them")
	case address != "" && rc.Sentinel != nil:
		return invalid("redis.address", address, "cannot be set together with redis.sentinel; the sentinels name the primary")
	case address != "" && rc.Cluster != nil:
		return invalid("redis.address", address, "cannot be set together with redis.cluster; list the nodes in redis.cluster.addresses")
	case rc.Cluster != nil:
		return checkCluster(rc, s)
	case rc.Sentinel != nil:
		return checkSentinel(rc, s)
	}

	if s.Store == "redis" {
		if !validHostPort(rc.Address) {
			return invalid("redis.address", rc.Address, "must be host:port")
		}
	}

	return nil
}

func checkCluster(rc RedisConfig, s *Settings) error {
	if len(rc.Cluster.Addresses) == 0 {
		return invalid("redis.cluster.addresses", "", "must list at least one node (host:port)")
	}

	for i, a := range rc.Cluster.Addresses {
		if !validHostPort(a) {
			return invalid("redis.cluster.addresses["+strconv.Itoa(i)+"]", a, "must be host:port")
		}
	}

	if rc.DB != 0 {
		return invalid("redis.db", rc.DB, "must be 0 with redis.cluster: a cluster has database 0 only")
	}

	s.Redis.Address = ""
	s.Redis.Cluster = &redisresp.ClusterOptions{Addresses: rc.Cluster.Addresses}

	return nil
}

func checkSentinel(rc RedisConfig, s *Settings) error {
	sc := rc.Sentinel

	if strings.TrimSpace(sc.MasterName) == "" || strings.ContainsAny(sc.MasterName, " \t\r\n") {
		return invalid("redis.sentinel.masterName", sc.MasterName, "must be the monitored group's name (no whitespace)")
	}

	if len(sc.Addresses) == 0 {
		return invalid("redis.sentinel.addresses", "", "must list at least one sentinel (host:port)")
	}

	for i, a := range sc.Addresses {
		if !validHostPort(a) {
			return invalid("redis.sentinel.addresses["+strconv.Itoa(i)+"]", a, "must be host:port")
		}
	}

	if sc.Username != "" && sc.Password == "" {
		return invalid("redis.sentinel.username", sc.Username, "needs redis.sentinel.password")
	}

	s.Redis.Address = ""
	s.Redis.Sentinel = &redisresp.SentinelOptions{
		MasterName: sc.MasterName, Addresses: sc.Addresses, Username: sc.Username, Password: sc.Password,
	}

	return nil
}

func validHostPort(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || port == "" {
		return false
	}

	n, err := strconv.Atoi(port)

	return err == nil && n > 0 && n < 65536
}

// parseTLS reads redis.tls: a boolean, or a map of RedisTLS keys (matched
// case-insensitively, as Traefik matches field names) that turns TLS on.
// Values may be strings, as the file provider sends every scalar.
func parseTLS(v interface{}, o *redisresp.Options) error {
	switch t := v.(type) {
	case nil:
		return nil
	case bool:
		o.TLS = t
		return nil
	case string:
		on, err := strconv.ParseBool(strings.TrimSpace(t))
		if err != nil && strings.TrimSpace(t) != "" {
			return invalid("redis.tls", t, "must be true, false or a map with ca, cert, key, serverName, insecureSkipVerify")
		}

		o.TLS = on

		return nil
	case map[string]interface{}:
		return parseTLSMap(t, o)
	case map[interface{}]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, val := range t {
			m[fmt.Sprint(k)] = val
		}

		return parseTLSMap(m, o)
	}

	return invalid("redis.tls", v, "must be true, false or a map with ca, cert, key, serverName, insecureSkipVerify")
}

func parseTLSMap(m map[string]interface{}, o *redisresp.Options) error {
	o.TLS = true
	tc := &o.TLSConfig

	for k, val := range m {
		if err := parseTLSField(k, val, tc); err != nil {
			return err
		}
	}

	if field, err := tc.Check(); err != nil {
		value := tc.CA
		switch field {
		case "cert":
			value = tc.Cert
		case "key":
			value = tc.Key
		}

		if redisresp.IsPEM(value) {
			value = "(inline PEM)" // never echo key material
		}

		return invalid("redis.tls."+field, value, err.Error())
	}

	return nil
}

// parseTLSField sets the field k of redis.tls's map form in tc.
func parseTLSField(k string, val interface{}, tc *redisresp.TLSOptions) error {
	field := "redis.tls." + k

	if strings.EqualFold(k, "insecureSkipVerify") {
		on, ok := val.(bool)
		if s, isString := val.(string); isString {
			var err error
			on, err = strconv.ParseBool(strings.TrimSpace(s))
			ok = err == nil
		}

		if !ok {
			return invalid(field, val, "must be true or false")
		}

		tc.InsecureSkipVerify = on

		return nil
	}

	s, ok := val.(string)
	if !ok && val != nil {
		return invalid(field, val, "must be a string")
	}

	switch strings.ToLower(k) {
	case "ca":
		tc.CA = s
	case "cert":
		tc.Cert = s
	case "key":
		tc.Key = s
	case "servername":
		tc.ServerName = strings.TrimSpace(s)
	default:
		return invalid(field, "", "unknown key; redis.tls takes ca, cert, key, serverName, insecureSkipVerify")
	}

	return nil
}
