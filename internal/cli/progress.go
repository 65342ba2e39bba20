package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// progress shows a bar on a terminal and a log line every few seconds otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	mu       sync.Mutex
	last     time.Time
	drawn    bool
	crd      string // the CRD the bar is drawn for
	interval time.Duration
}

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, tty: ok && term.IsTerminal(int(f.Fd())), interval: 2 * time.Second}
}

func (p *progress) update(s migrate.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rate, pct, eta := stats(s)
	if p.tty {
		p.bar(s, rate, pct, eta)
		return
	}
	if s.Total == 0 || (time.Since(p.last) < p.interval && s.Done < s.Total) {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "%s %s: %d/%d objects (%.0f%%), %.0f obj/s, ETA %s\n", metav1.Now().Format(time.TimeOnly), s.CRD, s.Done, s.Total, pct, rate, eta)
}

// stats are the rate in objects per second, the percentage done and the time left.
func stats(s migrate.Progress) (rate, pct float64, eta string) {
	rate, pct, eta = float64(s.Done)/max(s.Elapsed.Seconds(), 0.001), 100.0, "?"
	if rate > 0 && s.Total >= s.Done {
		eta = time.Duration(float64(s.Total-s.Done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	if s.Total > 0 {
		pct = 100 * float64(s.Done) / float64(s.Total)
	}
	return rate, pct, eta
}

// bar redraws the terminal's progress bar; a new CRD's bar starts on its own line.
func (p *progress) bar(s migrate.Progress, rate, pct float64, eta string) {
	if p.drawn && p.crd != s.CRD {
		fmt.Fprintln(p.w)
	}
	p.crd = s.CRD
	const width = 30
	filled := int(pct / 100 * width)
	fmt.Fprintf(p.w, "\r%s [%s%s] %d/%d %.0f obj/s ETA %s ", s.CRD, strings.Repeat("#", filled), strings.Repeat(".", width-filled), s.Done, s.Total, rate, eta)
	p.drawn = true
}

func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
