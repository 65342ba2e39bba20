package testenv

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ServiceIP is the `kubernetes` Service's cluster IP on a test control plane (the first
// address of envtest's service range, 10.0.0.0/24): in-cluster clients dial it.
const ServiceIP = "10.0.0.1"

// servingForNode makes kube-apiserver reachable from a node's Pods: it listens on every
// address, with a serving certificate for the host's address, the `kubernetes` Service
// IP and its DNS names (envtest's own names only localhost), and the ServiceAccount
// admission plugin that envtest turns off is on again, so Pods get their token. It
// reaches the kubelet (`kubectl logs`) at the node's InternalIP.
func servingForNode(api *envtest.APIServer) error {
	ip, err := HostIP()
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("localhost",
		[]net.IP{net.ParseIP("127.0.0.1"), ip, net.ParseIP(ServiceIP)},
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return fmt.Errorf("node serving certificate: %w", err)
	}
	// The certificate, then the CA that signed it: clients trust the CA.
	_, rest := pem.Decode(certPEM)
	if block, _ := pem.Decode(rest); block == nil {
		return errors.New("node serving certificate: no CA in the generated chain")
	}
	if err := os.WriteFile(filepath.Join(api.CertDir, "apiserver.crt"), certPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(api.CertDir, "apiserver.key"), keyPEM, 0o600); err != nil {
		return err
	}
	// envtest writes the ServiceAccount signing key only beside a serving certificate
	// of its own: write one too.
	saCert, saKey, err := certutil.GenerateSelfSignedCertKey("service-accounts", nil, nil)
	if err != nil {
		return fmt.Errorf("service account signing key: %w", err)
	}
	if err := os.WriteFile(filepath.Join(api.CertDir, "sa-signer.crt"), saCert, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(api.CertDir, "sa-signer.key"), saKey, 0o600); err != nil {
		return err
	}
	api.CA = bytes.TrimSpace(rest)
	// The kubelet's API (logs, exec) by the node's address: its name, the API server's
	// first choice by default, resolves nowhere.
	api.Configure().Set("bind-address", "0.0.0.0").Set("kubelet-preferred-address-types", "InternalIP,Hostname").
		Disable("disable-admission-plugins")
	return nil
}

// HostIP is the host's first IPv4 address outside loopback: the node's address, where
// kube-apiserver's `kubernetes` endpoint points.
func HostIP() (net.IP, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.To4(), nil
			}
		}
	}
	return nil, errors.New("no IPv4 address outside loopback: a test node needs one")
}
