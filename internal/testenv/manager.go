package testenv

import (
	"context"
	"testing"
)

// RunManager runs mgr (a controller-runtime manager, or anything that runs until its
// context ends) until the test ends, then waits for it to return and fails the test if it
// returned an error.
func RunManager(t testing.TB, mgr interface{ Start(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}
