package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

func TestProgress(t *testing.T) {
	var buf bytes.Buffer
	bar := &progress{w: &buf, tty: true}
	bar.update(migrate.Progress{CRD: "widgets.example.com", Done: 250, Total: 1000, Elapsed: time.Second})
	bar.finish()
	got := buf.String()
	for _, want := range []string{"\rwidgets.example.com [#######.......................] 250/1000", "250 obj/s", "ETA 3s", "\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("bar %q lacks %q", got, want)
		}
	}

	buf.Reset()
	lines := &progress{w: &buf, interval: time.Hour}
	lines.update(migrate.Progress{CRD: "w", Done: 10, Total: 100, Elapsed: time.Second})
	lines.update(migrate.Progress{CRD: "w", Done: 20, Total: 100, Elapsed: 2 * time.Second})  // within the interval: dropped
	lines.update(migrate.Progress{CRD: "w", Done: 100, Total: 100, Elapsed: 3 * time.Second}) // done: always shown
	if n := strings.Count(buf.String(), "\n"); n != 2 || !strings.Contains(buf.String(), "w: 100/100 objects (100%)") {
		t.Errorf("log lines:\n%s", buf.String())
	}
}
