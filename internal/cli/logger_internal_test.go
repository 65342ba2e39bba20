package cli

import (
	"io"
	"testing"
)

// client-go logs request and response bodies, Secrets included, from V(8): the
// controller's most verbose setting must stay below it.
func TestLoggerNeverReachesClientGoBodies(t *testing.T) {
	for _, debug := range []bool{false, true} {
		for _, jsonLogs := range []bool{false, true} {
			l := newLogger(io.Discard, debug, jsonLogs)
			if !l.V(0).Enabled() {
				t.Errorf("debug=%v json=%v: Info is off", debug, jsonLogs)
			}
			if got := l.V(4).Enabled(); got != debug {
				t.Errorf("debug=%v json=%v: V(4) enabled = %v, want %v", debug, jsonLogs, got, debug)
			}
			if l.V(8).Enabled() {
				t.Errorf("debug=%v json=%v: V(8) is on, so client-go would log Secret bodies", debug, jsonLogs)
			}
		}
	}
}
