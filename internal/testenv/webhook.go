package testenv

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
)

// Webhook is an HTTPS server on loopback that the API server can call as a conversion
// or admission webhook (clientConfig.url with CABundle).
type Webhook struct {
	URL      string
	CABundle []byte
	srv      *httptest.Server
}

// StartWebhook serves h over TLS on 127.0.0.1.
func StartWebhook(h http.Handler) *Webhook {
	srv := httptest.NewTLSServer(h)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return &Webhook{URL: srv.URL, CABundle: ca, srv: srv}
}

// Close stops the server.
func (w *Webhook) Close() { w.srv.Close() }
