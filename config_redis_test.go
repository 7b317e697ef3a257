package tierlimit

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
)

// testPEM returns a self-signed certificate and its key as PEM.
func testPEM(t *testing.T) (string, string) {
	t.Helper()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}

	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "t"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(4e9, 0), IsCA: true, BasicConstraintsValid: true}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}

	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}

	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
}

func redisConfig(mutate func(r *RedisConfig)) *Config {
	cfg := CreateConfig()
	cfg.Store = "redis"
	mutate(&cfg.Redis)

	return cfg
}

func sentinelConfig() *RedisSentinelConfig {
	return &RedisSentinelConfig{MasterName: "mymaster", Addresses: []string{"10.0.0.1:26379", "10.0.0.2:26379"}}
}

func TestInvalidRedisDeploymentsNameTheField(t *testing.T) {
	_, keyPEM := testPEM(t)
	badPEM := "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"

	cases := []struct {
		field, value string
		mutate       func(r *RedisConfig)
	}{
		{"redis.tls", "maybe", func(r *RedisConfig) { r.TLS = "maybe" }},
		{"redis.tls", "1.5", func(r *RedisConfig) { r.TLS = 1.5 }},
		{"redis.tls.cafile", "", func(r *RedisConfig) { r.TLS = map[string]interface{}{"cafile": "/etc/ca.pem"} }},
		{"redis.tls.insecureSkipVerify", "perhaps", func(r *RedisConfig) {
			r.TLS = map[string]interface{}{"insecureSkipVerify": "perhaps"}
		}},
		{"redis.tls.serverName", "[1 2]", func(r *RedisConfig) { r.TLS = map[string]interface{}{"serverName": []int{1, 2}} }},
		{"redis.tls.ca", "(inline PEM)", func(r *RedisConfig) { r.TLS = map[string]interface{}{"ca": badPEM} }},
		{"redis.tls.key", "", func(r *RedisConfig) { r.TLS = map[string]interface{}{"cert": "/etc/client.crt"} }},
		{"redis.tls.cert", "", func(r *RedisConfig) { r.TLS = map[string]interface{}{"key": keyPEM} }},
		{"redis.tls.cert", "(inline PEM)", func(r *RedisConfig) {
			r.TLS = map[string]interface{}{"cert": badPEM, "key": keyPEM}
		}},
		{"redis.sentinel.masterName", "", func(r *RedisConfig) { r.Sentinel = &RedisSentinelConfig{Addresses: []string{"a:1"}} }},
		{"redis.sentinel.masterName", "my master", func(r *RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.MasterName = "my master"
		}},
		{"redis.sentinel.addresses", "", func(r *RedisConfig) { r.Sentinel = &RedisSentinelConfig{MasterName: "m"} }},
		{"redis.sentinel.addresses[1]", "sentinel-2", func(r *RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.Addresses[1] = "sentinel-2"
		}},
		{"redis.sentinel.username", "watcher", func(r *RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.Username = "watcher"
		}},
		{"redis.address", "10.0.0.9:6379", func(r *RedisConfig) { r.Address = "10.0.0.9:6379"; r.Sentinel = sentinelConfig() }},
		{"redis.address", "10.0.0.9:6379", func(r *RedisConfig) {
			r.Address = "10.0.0.9:6379"
			r.Cluster = &RedisClusterConfig{Addresses: []string{"10.0.0.1:7000"}}
		}},
		{"redis.cluster", "10.0.0.1:7000", func(r *RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Cluster = &RedisClusterConfig{Addresses: []string{"10.0.0.1:7000"}}
		}},
		{"redis.cluster.addresses", "", func(r *RedisConfig) { r.Cluster = &RedisClusterConfig{} }},
		{"redis.cluster.addresses[0]", "node-1", func(r *RedisConfig) { r.Cluster = &RedisClusterConfig{Addresses: []string{"node-1"}} }},
		{"redis.db", "2", func(r *RedisConfig) { r.DB = 2; r.Cluster = &RedisClusterConfig{Addresses: []string{"10.0.0.1:7000"}} }},
		{"redis.address", "127.0.0.1:99999", func(r *RedisConfig) { r.Address = "127.0.0.1:99999" }},
	}

	for _, tc := range cases {
		_, err := New(context.Background(), http.NotFoundHandler(), redisConfig(tc.mutate), "invalid@test")
		if err == nil {
			t.Errorf("%s = %q accepted", tc.field, tc.value)
			continue
		}

		if !errors.Is(err, config.ErrConfig) {
			t.Errorf("%s: error does not wrap config.ErrConfig: %v", tc.field, err)
		}

		if want := tc.field + ` = "` + tc.value + `"`; !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}

		if strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Errorf("error %q shows key material", err)
		}
	}
}

func TestUnknownKeysUnderSentinelAndCluster(t *testing.T) {
	cases := map[string]func(r *RedisConfig){
		`unknown field "redis.sentinel.master" (did you mean "redis.sentinel.masterName"?)`: func(r *RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.Unknown = map[string]interface{}{"master": "mymaster"}
		},
		`unknown field "redis.cluster.adresses" (did you mean "redis.cluster.addresses"?)`: func(r *RedisConfig) {
			r.Cluster = &RedisClusterConfig{Addresses: []string{"10.0.0.1:7000"}, Unknown: map[string]interface{}{"adresses": "x"}}
		},
	}

	for want, mutate := range cases {
		_, err := New(context.Background(), http.NotFoundHandler(), redisConfig(mutate), "unknown@test")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %s", err, want)
		}
	}
}

func TestRedisDeploymentsAccepted(t *testing.T) {
	certPEM, keyPEM := testPEM(t)

	cases := []struct {
		name   string
		mutate func(r *RedisConfig)
		check  func(s *config.Settings) bool
	}{
		{"tls true from the file provider", func(r *RedisConfig) { r.TLS = "true" }, func(s *config.Settings) bool {
			return s.Redis.TLS && s.Redis.TLSConfig.CA == ""
		}},
		{"tls false", func(r *RedisConfig) { r.TLS = false }, func(s *config.Settings) bool { return !s.Redis.TLS }},
		{"tls unset", func(r *RedisConfig) {}, func(s *config.Settings) bool { return !s.Redis.TLS }},
		{"inline CA and client pair, insecureSkipVerify as string", func(r *RedisConfig) {
			r.TLS = map[string]interface{}{"CA": certPEM, "cert": certPEM, "key": keyPEM, "serverName": "redis.internal", "insecureSkipVerify": "false"}
		}, func(s *config.Settings) bool {
			o := s.Redis.TLSConfig
			return s.Redis.TLS && o.CA == certPEM && o.Key == keyPEM && o.ServerName == "redis.internal" && !o.InsecureSkipVerify
		}},
		{"files are not read by New", func(r *RedisConfig) {
			r.TLS = map[interface{}]interface{}{"ca": "/nonexistent/ca.pem", "insecureSkipVerify": true}
		}, func(s *config.Settings) bool {
			return s.Redis.TLSConfig.CA == "/nonexistent/ca.pem" && s.Redis.TLSConfig.InsecureSkipVerify
		}},
		{"cluster", func(r *RedisConfig) {
			r.Cluster = &RedisClusterConfig{Addresses: []string{"10.0.0.1:7000", "[::1]:7001"}}
		},
			func(s *config.Settings) bool {
				return s.Redis.Cluster != nil && len(s.Redis.Cluster.Addresses) == 2 && s.Redis.Address == "" && s.Redis.Sentinel == nil
			}},
		{"sentinel next to the default address", func(r *RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.Username, r.Sentinel.Password = "watcher", "pw"
		}, func(s *config.Settings) bool {
			so := s.Redis.Sentinel
			return so != nil && so.MasterName == "mymaster" && len(so.Addresses) == 2 && so.Password == "pw" && s.Redis.Address == ""
		}},
	}

	for _, tc := range cases {
		s, err := parse(redisConfig(tc.mutate))
		if err != nil {
			t.Errorf("%s: rejected: %v", tc.name, err)
			continue
		}

		if !tc.check(s) {
			t.Errorf("%s: parsed as %+v", tc.name, s.Redis)
		}
	}
}
