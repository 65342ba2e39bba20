package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// syncBuffer is a bytes.Buffer safe for the controller's log writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestControllerCommand runs `upgradeguard controller` against the real API server: its
// probes answer, its metrics endpoint serves upgradeguard's metrics, and a stop signal
// ends it with exit 0. Without the CRDs it exits 2 at once, saying how to install them.
func TestControllerCommand(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	if err := cp.DeleteAllCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	args := []string{"--kubeconfig", cp.Kubeconfig, "controller", "--enable-webhook=false", "--leader-election-namespace", "default"}
	r := run(t, append(args, "--metrics-bind-address", "0", "--health-probe-bind-address", "0")...)
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "install the CRDs") {
		t.Fatalf("without CRDs: exit %d, stderr %q; want exit 2 saying to install the CRDs", r.code, r.stderr)
	}

	if err := testenv.ApplyUpgradeguardCRDs(ctx, cp.Config); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteAllCRDs(context.WithoutCancel(ctx)) })
	metricsAddr, probeAddr := freePort(t), freePort(t)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(runCtx, append(args, "--metrics-bind-address", metricsAddr, "--health-probe-bind-address", probeAddr),
			cli.Streams{Out: io.Discard, ErrOut: &errOut})
	}()
	get := func(url string) (string, error) {
		resp, err := http.Get(url)
		if err != nil {
			return "", err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s: %s", url, resp.Status)
		}
		return string(body), err
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		h, errH := get("http://" + probeAddr + "/healthz")
		r, errR := get("http://" + probeAddr + "/readyz")
		return errH == nil && errR == nil && h == "ok" && r == "ok", nil
	})
	if err != nil {
		t.Fatalf("probes never answered: %v\n%s", err, errOut.String())
	}
	body, err := get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"upgradeguard_pending_migrations", "upgradeguard_migration_duration_seconds"} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	stop()
	select {
	case code := <-done:
		if code != cli.ExitSafe {
			t.Errorf("stopped controller exited %d, want 0\n%s", code, errOut.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("controller did not stop within a minute of its signal")
	}
}
