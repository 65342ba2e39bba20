package webhook

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// TestMemoryReaderSecret: a values Secret read once is read again with no API request
// while it is unchanged, and a change to it is seen by the next reads, on the real API
// server with the manager's kind of cache.
func TestMemoryReaderSecret(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	cp := testenv.ForTest(t)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	writer, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	cfg := testenv.CountRequests(cp.Config, &n)
	c, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = c.Start(runCtx) }()
	api, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	r := newMemoryReader(c, api)

	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "memory-values"}, Data: map[string][]byte{"values.yaml": []byte("replicas: 1")}}
	if err := writer.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	readsFromMemory := func(want string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			before := n.Load()
			var got corev1.Secret
			if err := r.Get(ctx, client.ObjectKeyFromObject(sec), &got); err != nil {
				return false, err
			}
			return string(got.Data["values.yaml"]) == want && n.Load() == before, nil
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, readsFromMemory("replicas: 1")); err != nil {
		t.Fatalf("the unchanged Secret was never read from memory: %v", err)
	}
	sec.Data["values.yaml"] = []byte("replicas: 2")
	if err := writer.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, readsFromMemory("replicas: 2")); err != nil {
		t.Fatalf("the changed Secret was never seen, then read from memory: %v", err)
	}
}
