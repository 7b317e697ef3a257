package rule

import "testing"

func TestKeysByKind(t *testing.T) {
	cases := []struct {
		kind              int
		client, principal string
		want              string
	}{
		{KeyOfClient, "1.2.3.4", "alice", "1.2.3.4"},
		{KeyOfPrincipal, "1.2.3.4", "alice", "alice"},
		{KeyOfConst, "1.2.3.4", "alice", "global"},
		{KeyOfPrincipalElseClient, "1.2.3.4", "alice", "alice"},
		{KeyOfPrincipalElseClient, "1.2.3.4", "", "ip:1.2.3.4"},
	}

	for _, tc := range cases {
		l := &Layer{Limits: Limits{KeyKind: tc.kind, ConstKey: "global"}}
		if got := KeyFor(l, tc.client, tc.principal, nil); got != tc.want {
			t.Errorf("kind %d: %q, want %q", tc.kind, got, tc.want)
		}
	}
}
