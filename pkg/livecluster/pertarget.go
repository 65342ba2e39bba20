package livecluster

import "sync"

// PerTarget is state of type T that a caller keeps per target of Clusters, built on first
// use and dropped with the target (evicted, removed, or Clusters stopped). It lets the
// caller own its memory of a target (package check keeps the CRDs of release revisions and
// its compiled schema judges this way) without this package knowing its types. Declare
// one per kind of state, at package level; it is safe for concurrent use.
type PerTarget[T any] struct {
	build func() T
}

// NewPerTarget declares a kind of per-target state, built by build on a target's first
// use.
func NewPerTarget[T any](build func() T) *PerTarget[T] {
	return &PerTarget[T]{build: build}
}

// Of returns k's state, built on first use. ok is false for a KubeCluster that keeps
// nothing between decisions (NewKubeCluster, Connect): the caller then keeps nothing
// either.
func (p *PerTarget[T]) Of(k *KubeCluster) (v T, ok bool) {
	if k == nil || k.slots == nil {
		return v, false
	}
	return k.slots.get(p, func() any { return p.build() }).(T), true
}

// slots holds a target's PerTarget states, by the *PerTarget that declares each.
type slots struct {
	mu sync.Mutex
	m  map[any]any
}

func newSlots() *slots { return &slots{m: map[any]any{}} }

func (s *slots) get(key any, build func() any) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[key]
	if !ok {
		v = build()
		s.m[key] = v
	}
	return v
}
