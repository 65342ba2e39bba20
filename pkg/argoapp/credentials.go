package argoapp

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/transport"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
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

// namespace is where Argo CD keeps its repository Secrets.
func (o Options) namespace() string {
	if o.Namespace == "" {
		return DefaultNamespace
	}
	return o.Namespace
}

// credentialsFor finds the repository Secret for url as Argo CD does: a "repository"
// Secret whose url is the same repository, else the "repo-creds" template with the
// longest url prefix. None, or Secrets it may not list, means no credentials.
func credentialsFor(ctx context.Context, o Options, url string) (credentials, error) {
	if o.Secrets == nil {
		return credentials{}, nil
	}
	ns := o.namespace()
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

// RepositoryError says that the chart server of an Application's Helm source (a Helm
// repository or an OCI registry) could not be read, and what in Argo CD's repository
// Secret would make it readable: Argo CD reads the server with the same Secret, so the
// sync fails the same way.
type RepositoryError struct {
	Subject string
	Kind    Kind
	// RepoURL is the source's repoURL: the url a repository Secret for it holds.
	RepoURL string
	// Secret is the repository Secret (namespace/name) that was used; "" when none in
	// Namespace matched RepoURL.
	Secret, Namespace string
	// PlainHTTP is true when the registry answered plain HTTP to HTTPS.
	PlainHTTP bool
	// NoSecrets is true when no repository Secret was read: a record of the cluster (a
	// snapshot) holds none, and the chart was fetched with Helm's own settings alone.
	NoSecrets bool
	Err       error
}

func (e *RepositoryError) Error() string {
	switch {
	case e.NoSecrets && e.PlainHTTP:
		return fmt.Sprintf("%s: the registry of %s speaks plain HTTP: %v; only Argo CD's repository Secret says so (insecureOCIForceHttp), "+
			"and a snapshot holds no repository Secret: review the Application against the live cluster (--cluster PATH=CONTEXT)", e.Subject, e.RepoURL, e.Err)
	case e.NoSecrets:
		return fmt.Sprintf("%s: read %s: %v; a snapshot holds no repository credentials (Argo CD's repository Secrets stay on the cluster), "+
			"so the chart is fetched with Helm's own settings here: if the %s, %sreview the Application against the live cluster (--cluster PATH=CONTEXT)",
			e.Subject, e.RepoURL, e.Err, e.needs(), e.helmLogin())
	case e.PlainHTTP && e.Secret == "":
		return fmt.Sprintf("%s: the registry of %s speaks plain HTTP, and no Argo CD repository Secret in namespace %s has url %s: %v; "+
			`add one with enableOCI: "true" and insecureOCIForceHttp: "true" (%s)`, e.Subject, e.RepoURL, e.Namespace, e.RepoURL, e.Err, e.addCommand())
	case e.PlainHTTP:
		return fmt.Sprintf(`%s: the registry of %s speaks plain HTTP, and repository Secret %s does not say insecureOCIForceHttp: "true": %v; set it`,
			e.Subject, e.RepoURL, e.Secret, e.Err)
	case e.Secret == "":
		return fmt.Sprintf("%s: read %s: %v; no Argo CD repository Secret in namespace %s has url %s: if the %s, add one (%s)",
			e.Subject, e.RepoURL, e.Err, e.Namespace, e.RepoURL, e.needs(), e.addCommand())
	}
	return fmt.Sprintf("%s: read %s with repository Secret %s: %v; check the Secret's url, username and password", e.Subject, e.RepoURL, e.Secret, e.Err)
}

func (e *RepositoryError) Unwrap() error { return e.Err }

// helmLogin words, for an OCI registry, how to give Helm its credentials here, which
// Helm's registry config then holds: "log Helm in (helm registry login HOST), or ". A Helm
// repository's credentials come only from Argo CD's repository Secret.
func (e *RepositoryError) helmLogin() string {
	if e.Kind != OCI {
		return ""
	}
	host, _, _ := strings.Cut(strings.TrimPrefix(e.RepoURL, "oci://"), "/")
	return fmt.Sprintf("log Helm in to it (%s), or ", cmdline.HelmRegistryLogin{Host: host})
}

// needs says when a repository Secret is needed: for credentials, and for an OCI
// registry without TLS.
func (e *RepositoryError) needs() string {
	if e.Kind == OCI {
		return "registry wants credentials or speaks plain HTTP"
	}
	return "repository wants credentials"
}

// addCommand is the argocd command that writes the repository Secret: an OCI Helm
// repository (bare host and path), an OCI repository (oci://) or a Helm repository.
func (e *RepositoryError) addCommand() string {
	switch {
	case e.Kind != OCI:
		return cmdline.RepoAdd{URL: e.RepoURL, Type: "helm", Credentials: true}.String()
	case strings.HasPrefix(e.RepoURL, "oci://"):
		return cmdline.RepoAdd{URL: e.RepoURL, Type: "oci", PlainHTTP: true}.String()
	}
	return cmdline.RepoAdd{URL: e.RepoURL, Type: "helm", EnableOCI: true, PlainHTTP: true}.String()
}

// Explain turns a failure to read the chart's repository or registry (a remote
// *chartsource.LoadError) into a *RepositoryError that names the repository Secret to
// add or fix; other errors are returned as they are.
func (c *Chart) Explain(err error) error {
	var load *chartsource.LoadError
	if c == nil || (c.Kind != OCI && c.Kind != HelmRepository) || !errors.As(err, &load) || !load.Remote() {
		return err
	}
	return &RepositoryError{Subject: c.Subject, Kind: c.Kind, RepoURL: c.RepoURL, Secret: c.Credentials, Namespace: c.secretsNamespace,
		PlainHTTP: chartsource.AnsweredPlainHTTP(err), NoSecrets: c.noSecrets, Err: err}
}
