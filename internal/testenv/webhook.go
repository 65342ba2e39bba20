package testenv

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	certutil "k8s.io/client-go/util/cert"
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

// TLSWebhook is an HTTPS server on loopback with a certificate authority of its own,
// generated for it: the API server trusts it only through the CABundle a webhook
// configuration names, so two of them stand for two different webhook deployments. Its
// address is fixed before it serves (NewTLSWebhook, then Start), so a CRD can name a
// webhook that is not serving yet.
type TLSWebhook struct {
	URL      string
	CABundle []byte
	addr     string
	srv      *http.Server
	cert     tls.Certificate
}

// NewTLSWebhook generates a CA and a serving certificate for 127.0.0.1 signed by it, and
// picks a free loopback port; nothing listens until Start.
func NewTLSWebhook(h http.Handler) (*TLSWebhook, error) {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	// The chain is the serving certificate, then the CA that signed it.
	_, rest := pem.Decode(certPEM)
	if block, _ := pem.Decode(rest); block == nil {
		return nil, fmt.Errorf("webhook certificate: no CA in the generated chain")
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return &TLSWebhook{URL: "https://" + addr, CABundle: bytes.TrimSpace(rest), addr: addr, cert: cert,
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}, nil
}

// Start serves on the address chosen by NewTLSWebhook.
func (w *TLSWebhook) Start() error {
	l, err := tls.Listen("tcp", w.addr, &tls.Config{Certificates: []tls.Certificate{w.cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return fmt.Errorf("webhook listen on %s: %w", w.addr, err)
	}
	go func() { _ = w.srv.Serve(l) }()
	return nil
}

// Close stops serving at once: connections are closed, and new ones are refused.
func (w *TLSWebhook) Close() { _ = w.srv.Close() }
