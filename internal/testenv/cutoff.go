package testenv

import (
	"errors"
	"net/http"
	"sync/atomic"
)

// ErrCutOff is the error of every request through a Cutoff once it is cut.
var ErrCutOff = errors.New("cut off from the API server (test)")

// Cutoff is a switch on the clients of one process under test: once Cut, every request
// through a transport it wrapped fails at once without reaching any API server, as if the
// process had crashed or been partitioned away. Nothing it meant to write afterwards
// (a Lease released, a status saved) arrives. Streams already open (watches) are not cut.
type Cutoff struct{ off atomic.Bool }

// Wrap is a transport.WrapperFunc for rest.Config.Wrap.
func (c *Cutoff) Wrap(rt http.RoundTripper) http.RoundTripper {
	return cutoffTransport{rt: rt, c: c}
}

// Cut refuses every later request.
func (c *Cutoff) Cut() { c.off.Store(true) }

type cutoffTransport struct {
	rt http.RoundTripper
	c  *Cutoff
}

func (t cutoffTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.c.off.Load() {
		return nil, ErrCutOff
	}
	return t.rt.RoundTrip(r)
}
