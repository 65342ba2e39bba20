package kubeclient

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func kubeconfig(t *testing.T) []byte {
	t.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443"}
	c.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "secret-token-value"}
	c.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	c.CurrentContext = "x"
	b, err := clientcmd.Write(*c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReadKubeconfig: the key is found as documented, every remote config is bounded by
// RemoteTimeout, and errors never carry the data.
func TestReadKubeconfig(t *testing.T) {
	data := kubeconfig(t)
	secret := func(d map[string][]byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: "c1-kubeconfig"}, Data: d}
	}

	cfg, kc, err := ReadKubeconfig(secret(map[string][]byte{"value.yaml": data, "kubeconfig": []byte("x")}), "")
	if err != nil || kc.Key != "value.yaml" || len(kc.Hash) != 12 {
		t.Fatalf("default keys: %v %+v", err, kc)
	}
	if cfg.Timeout != RemoteTimeout {
		t.Errorf("timeout %v, want RemoteTimeout %v", cfg.Timeout, RemoteTimeout)
	}

	_, kc, err = ReadKubeconfig(secret(map[string][]byte{"kubeconfig": []byte("secret-token-value: [")}), "kubeconfig")
	if err == nil || kc.Key != "kubeconfig" || strings.Contains(err.Error(), "secret-token-value") {
		t.Errorf("bad kubeconfig: %v %+v", err, kc)
	}
	if _, _, err := ReadKubeconfig(secret(nil), ""); err == nil || !strings.Contains(err.Error(), "name the key in the reference") {
		t.Errorf("no key: %v", err)
	}
}
