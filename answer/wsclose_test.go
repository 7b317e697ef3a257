package answer

import (
	"strings"
	"testing"
)

func TestCloseFrameReasonFitsAControlFrame(t *testing.T) {
	f := closeFrame(1013, strings.Repeat("x", 300))
	if len(f) != 4+123 || f[1] != 125 {
		t.Fatalf("frame of %d bytes, length byte %d", len(f), f[1])
	}
}
