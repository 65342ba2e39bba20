package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// apiCounter counts the API requests a process's clients make, watches left out (an
// informer's watch is one long request, not one per decision). Reads are GETs (a LIST is a
// GET of a collection); writes are every other verb.
type apiCounter struct {
	mu            sync.Mutex
	reads, writes int
	seen          map[string]int // "GET /path" -> count since the last reset
	// trace, when set (tracing), records each request's start and end (its body read to
	// the end or closed), for a timeline of one round.
	trace   []*traced
	tracing bool
}

// traced is one request of a trace.
type traced struct {
	what       string
	start, end time.Time
}

// wrap returns a copy of cfg whose clients count their requests in c.
func (c *apiCounter) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &countingTransport{rt: rt, c: c} })
	return cfg
}

// snapshot returns the counts since the last call and starts counting afresh.
func (c *apiCounter) snapshot() (reads, writes int, seen map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	reads, writes, seen = c.reads, c.writes, c.seen
	c.reads, c.writes, c.seen = 0, 0, map[string]int{}
	return reads, writes, seen
}

type countingTransport struct {
	rt http.RoundTripper
	c  *apiCounter
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if w := req.URL.Query().Get("watch"); w != "true" && w != "1" {
		t.c.mu.Lock()
		if req.Method == http.MethodGet {
			t.c.reads++
		} else {
			t.c.writes++
		}
		if t.c.seen == nil {
			t.c.seen = map[string]int{}
		}
		what := req.Method + " " + req.URL.Path + queryNames(req.URL.Query())
		if strings.Contains(req.Header.Get("Accept"), "as=PartialObjectMetadata") {
			what += " (metadata)"
		}
		t.c.seen[what]++
		var tr *traced
		if t.c.tracing {
			tr = &traced{what: what, start: time.Now()}
			t.c.trace = append(t.c.trace, tr)
		}
		t.c.mu.Unlock()
		if tr != nil {
			resp, err := t.rt.RoundTrip(req)
			if err != nil || resp.Body == nil {
				t.c.ended(tr)
				return resp, err
			}
			resp.Body = &tracedBody{ReadCloser: resp.Body, end: func() { t.c.ended(tr) }}
			return resp, nil
		}
	}
	return t.rt.RoundTrip(req)
}

// ended records the end of a traced request, once.
func (c *apiCounter) ended(tr *traced) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tr.end.IsZero() {
		tr.end = time.Now()
	}
}

// tracedBody calls end when its body has been read to the end or closed.
type tracedBody struct {
	io.ReadCloser
	end func()
}

func (b *tracedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end()
	}
	return n, err
}

func (b *tracedBody) Close() error {
	b.end()
	return b.ReadCloser.Close()
}

// traceOf runs f once with every request traced, and returns the requests' timeline:
// each request's start and duration from f's start, in the order started.
func (c *apiCounter) traceOf(f func() error) (string, time.Duration, error) {
	c.mu.Lock()
	c.trace, c.tracing = nil, true
	c.mu.Unlock()
	start := time.Now()
	err := f()
	elapsed := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	trace := c.trace
	c.trace, c.tracing = nil, false
	var b strings.Builder
	for _, tr := range trace {
		end := "unfinished"
		if !tr.end.IsZero() {
			end = fmt.Sprintf("%6.1f ms", float64(tr.end.Sub(tr.start).Microseconds())/1000)
		}
		fmt.Fprintf(&b, "  +%6.1f ms %s  %s\n", float64(tr.start.Sub(start).Microseconds())/1000, end, tr.what)
	}
	return b.String(), elapsed, err
}

// describeSeen lists the requests of a snapshot, most frequent first.
func describeSeen(seen map[string]int) string {
	keys := slices.Collect(maps.Keys(seen))
	slices.SortFunc(keys, func(a, b string) int {
		if seen[a] != seen[b] {
			return seen[b] - seen[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%dx %s", seen[k], k))
	}
	return strings.Join(parts, ", ")
}

// startGate runs the controller's manager with the gate on cfg, serving the webhook on
// port with the certificates in certDir, until the returned stop is called. It returns
// once the manager's readiness probe passes, as a kubelet waits for it before the Pod
// takes admission requests (the gate's warm-up included).
func startGate(ctx context.Context, cfg *rest.Config, port int, certDir, helmDir string, cache bool) (stop func(), err error) {
	probe, err := freePort()
	if err != nil {
		return nil, err
	}
	mgr, err := controller.NewManager(cfg, controller.Options{LeaderElectionNamespace: "default", MetricsAddr: "0", ProbeAddr: probe,
		EnableWebhook: true, WebhookPort: port, WebhookCertDir: certDir})
	if err != nil {
		return nil, err
	}
	if err := webhook.Setup(mgr, webhook.Options{HelmCacheDir: helmDir, ChartCacheSize: map[bool]int{true: 0, false: -1}[cache]}); err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	stop = func() { cancel(); <-done }
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		stop()
		return nil, errors.New("the manager's cache did not sync")
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+probe+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		stop()
		return nil, fmt.Errorf("the gate did not become ready: %w", err)
	}
	return stop, nil
}

// freePort is a loopback address whose port was free a moment ago.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

// gateServe is the bench's child process (mode gate-serve): a fresh process with the gate
// and cold caches, so a first decision pays what a restarted webhook pays. It prints
// "ready" once it serves, then answers each "count" line on stdin with the API requests
// its clients made since the last answer ("reads writes requests..."), and exits at EOF.
func gateServe(ctx context.Context, args []string) error {
	if len(args) != 4 {
		return errors.New("usage: gate-serve KUBECONFIG PORT CERTDIR HELMDIR")
	}
	ctrllog.SetLogger(logr.Discard())
	ctrl.SetLogger(logr.Discard())
	cfg, err := clientcmd.BuildConfigFromFlags("", args[0])
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	counter := &apiCounter{}
	stop, err := startGate(ctx, counter.wrap(cfg), port, args[2], args[3], true)
	if err != nil {
		return err
	}
	defer stop()
	counter.snapshot()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "count" {
			r, w, seen := counter.snapshot()
			fmt.Printf("%d %d %s\n", r, w, describeSeen(seen))
		}
	}
	if err := in.Err(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// queryNames are a request's query parameter names ("?limit&resourceVersion"), which tell
// an informer's LIST from a decision's own.
func queryNames(q url.Values) string {
	if len(q) == 0 {
		return ""
	}
	return "?" + strings.Join(slices.Sorted(maps.Keys(q)), "&")
}
