package config

import (
	"errors"
	"testing"
)

func TestUnknownKeysAreErrorsAtEveryLevel(t *testing.T) {
	cases := []struct {
		set  func(c *Config)
		want string
	}{
		{func(c *Config) { c.Unknown = map[string]interface{}{"ipp": map[string]interface{}{"points": "5"}} },
			`invalid configuration: unknown field "ipp" (did you mean "ip"?)`},
		{func(c *Config) { c.IP.Unknown = map[string]interface{}{"point": "5"} },
			`invalid configuration: unknown field "ip.point" (did you mean "ip.points"?)`},
		{func(c *Config) { c.Redis.Unknown = map[string]interface{}{"adress": "redis:6379"} },
			`invalid configuration: unknown field "redis.adress" (did you mean "redis.address"?)`},
		{func(c *Config) { c.Unknown = map[string]interface{}{"ipv6Prefix": "48"} },
			`invalid configuration: unknown field "ipv6Prefix" (did you mean "ipv6PrefixLength"?)`},
		{func(c *Config) {
			c.Routes = []RouteConfig{
				{Name: "a", Paths: []string{"/a"}, Points: 1, Duration: "1s"},
				{Name: "b", Paths: []string{"/b"}, Points: 1, Duration: "1s", Unknown: map[string]interface{}{"pathz": "/b"}},
			}
		}, `invalid configuration: unknown field "routes[1].pathz" (did you mean "routes[1].paths"?)`},
		{func(c *Config) { c.Principal.Unknown = map[string]interface{}{"userheaders": "X"} },
			`invalid configuration: unknown field "principal.userheaders" (did you mean "principal.userHeader"?)`},
		{func(c *Config) { c.Websocket.Unknown = map[string]interface{}{"maxConnections": "1"} },
			`invalid configuration: unknown field "websocket.maxConnections" (did you mean "websocket.maxConnectionsPerIP"?)`},
		{func(c *Config) { c.Assets.Unknown = map[string]interface{}{"somethingElse": "1", "abc": "2"} },
			`invalid configuration: unknown field "assets.abc"`},
		{func(c *Config) { c.Exempt.Unknown = map[string]interface{}{"ip": "10.0.0.1"} },
			`invalid configuration: unknown field "exempt.ip" (did you mean "exempt.ips"?)`},
		{func(c *Config) { c.Status.Unknown = map[string]interface{}{"pth": "/x"} },
			`invalid configuration: unknown field "status.pth" (did you mean "status.path"?)`},
		{func(c *Config) { c.Response.Unknown = map[string]interface{}{"status": "503"} },
			`invalid configuration: unknown field "response.status" (did you mean "response.statusCode"?)`},
	}

	for _, c := range cases {
		cfg := Defaults()
		c.set(cfg)

		_, err := Parse(cfg)
		if err == nil || err.Error() != c.want || !errors.Is(err, ErrConfig) {
			t.Errorf("got %v\nwant %s", err, c.want)
		}
	}

	if _, err := Parse(Defaults()); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

func TestKeyNamesAreReadmeSpelling(t *testing.T) {
	for field, want := range map[string]string{
		"IP": "ip", "IPv6PrefixLength": "ipv6PrefixLength", "DryRun": "dryRun", "TLS": "tls",
		"DB": "db", "IPs": "ips", "MaxConnectionsPerIP": "maxConnectionsPerIP", "AllowedIPs": "allowedIPs",
	} {
		if got := keyName(field); got != want {
			t.Errorf("keyName(%s) = %s, want %s", field, got, want)
		}
	}
}
