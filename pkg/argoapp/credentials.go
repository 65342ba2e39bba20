package argoapp

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/transport"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
)

// SecretTypeLabel is the label of Argo CD's repository Secrets: "repository" for one
// repository, "repo-creds" for a credential template that matches URLs by prefix.
const SecretTypeLabel = "argocd.argoproj.io/secret-type"

// credentials are what a repository Secret gives: never reported, only used.
type credentials struct {
	secret             string // namespace/name
	id                 string // namespace/name/uid/resourceVersion, for chartsource's cache
	username, password string
	insecure, plainOCI bool
}

func (c credentials) apply(o *chartsource.Options) {
	o.Username, o.Password = c.username, c.password
	o.InsecureSkipTLSVerify, o.PlainHTTP = c.insecure, c.plainOCI
	o.CredentialsID = c.id
}

func (c credentials) gitAuth() transport.AuthMethod { return basicAuth(c.username, c.password) }

// credentialsFor finds the repository Secret for url as Argo CD does: a "repository"
// Secret whose url is the same repository, else the "repo-creds" template with the
// longest url prefix. None, or Secrets it may not list, means no credentials.
func credentialsFor(ctx context.Context, o Options, url string) (credentials, error) {
	if o.Secrets == nil {
		return credentials{}, nil
	}
	ns := o.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	list, err := o.Secrets.Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: SecretTypeLabel + " in (repository,repo-creds)"})
	if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
		return credentials{}, nil
	}
	if err != nil {
		return credentials{}, fmt.Errorf("list Argo CD repository Secrets in %s: %w", ns, err)
	}
	s := matchSecret(list.Items, url)
	if s == nil {
		return credentials{}, nil
	}
	return fromSecret(s)
}

// matchSecret picks the Secret for url: the repository Secret of the same repository,
// else the repo-creds Secret with the longest matching prefix.
func matchSecret(secrets []corev1.Secret, url string) *corev1.Secret {
	want := normalizeURL(url)
	var best *corev1.Secret
	for i := range secrets {
		s := &secrets[i]
		u := normalizeURL(string(s.Data["url"]))
		switch s.Labels[SecretTypeLabel] {
		case "repository":
			if u == want {
				return s
			}
		case "repo-creds":
			if u != "" && strings.HasPrefix(want, u) && (best == nil || len(u) > len(normalizeURL(string(best.Data["url"])))) {
				best = s
			}
		}
	}
	return best
}

// normalizeURL compares repository URLs the way Argo CD does, loosely: no scheme for OCI,
// no trailing slash or .git, lower case.
func normalizeURL(u string) string {
	u = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(u)), "oci://")
	return strings.TrimSuffix(strings.TrimSuffix(u, "/"), ".git")
}

// fromSecret reads username and password. A Secret with only other kinds of
// credentials (SSH keys, GitHub App, TLS client certificates) is an error that says so.
func fromSecret(s *corev1.Secret) (credentials, error) {
	c := credentials{
		secret: s.Namespace + "/" + s.Name, id: fmt.Sprintf("%s/%s/%s/%s", s.Namespace, s.Name, s.UID, s.ResourceVersion),
		username: string(s.Data["username"]), password: string(s.Data["password"]),
		insecure: string(s.Data["insecure"]) == "true", plainOCI: string(s.Data["insecureOCIForceHttp"]) == "true",
	}
	if c.username != "" || c.password != "" {
		return c, nil
	}
	for _, k := range []string{"sshPrivateKey", "githubAppPrivateKey", "tlsClientCertData", "gcpServiceAccountKey", "bearerToken"} {
		if len(s.Data[k]) > 0 {
			return c, &unusableError{secret: c.secret, key: k}
		}
	}
	return c, nil
}

// unusableError says that a repository Secret holds only credentials upgradeguard does
// not use.
type unusableError struct{ secret, key string }

func (e *unusableError) Error() string {
	return fmt.Sprintf("repository Secret %s holds %s credentials; upgradeguard uses only username and password", e.secret, e.key)
}
