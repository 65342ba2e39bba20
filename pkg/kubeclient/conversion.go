package kubeclient

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// conversionWebhookText starts every error the API server's webhook converter returns
// (apiextensions-apiserver's webhook_converter.go: "conversion webhook for <gvk> failed:
// ...", "... returned invalid ..."), from 1.16 to 1.38. The API server wraps it in its
// answer unchanged, whatever the status.
const conversionWebhookText = "conversion webhook for "

// IsConversionFailure says whether err is the API server's answer when a CRD's conversion
// webhook did not convert an object: the webhook is not serving yet, its address or
// certificate is wrong, it answered badly, or the API server still calls the one the CRD
// named before a change of spec.conversion. Measured on the real API server (1.32 to
// 1.38): a GET answers 500 InternalError ("StorageError: corrupt object ... object not
// decodable ... conversion webhook for ... failed"), a write 500 without a reason, and a
// LIST 429 TooManyRequests with Retry-After ("storage is (re)initializing": the watch
// cache of that version cannot fill) or 500 from etcd. A 503 carrying the same text
// counts too.
func IsConversionFailure(err error) bool {
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return false
	}
	s := status.Status()
	switch s.Code {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusServiceUnavailable:
	default:
		return false
	}
	if strings.Contains(s.Message, conversionWebhookText) {
		return true
	}
	if s.Details != nil {
		for _, c := range s.Details.Causes {
			if strings.Contains(c.Message, conversionWebhookText) {
				return true
			}
		}
	}
	return false
}

// StorageFallback is the one rule for reading a CRD's objects when a conversion webhook
// does not answer (michelangelo-ai/michelangelo#785: listing at every version hit a
// webhook not serving yet): a read at version that failed with IsConversionFailure is
// made again at the storage version, where objects already stored there need no
// conversion at all. ok is false when there is nothing to fall back to: another error,
// the read was at the storage version already, or the CRD does not serve it.
func StorageFallback(crd *apiextv1.CustomResourceDefinition, version string, err error) (storage string, ok bool) {
	storage = crdversions.StorageVersion(crd)
	if !IsConversionFailure(err) || storage == "" || storage == version || !crdversions.Serves(crd, storage) {
		return "", false
	}
	return storage, true
}

// conversionFailFast answers a conversion failure at once: client-go repeats a 429 or
// 5xx that carries Retry-After up to ten times, and a LIST at a version whose watch cache
// cannot fill because its conversion webhook is down answers 429 with a Retry-After of up
// to 30 seconds, so one LIST would take minutes before its caller could fall back to the
// storage version (StorageFallback) or count and bound its own retries. The Retry-After
// of such an answer is removed; every other answer passes unchanged.
type conversionFailFast struct{ next http.RoundTripper }

// maxErrorBody bounds how much of an error answer is read to recognise it; a Status is
// a few kilobytes at most.
const maxErrorBody = 64 << 10

func (t conversionFailFast) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if err != nil || resp.Header.Get("Retry-After") == "" ||
		(resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < http.StatusInternalServerError) {
		return resp, err
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	rest := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	if rerr == nil && bytes.Contains(body, []byte(conversionWebhookText)) {
		resp.Header = resp.Header.Clone()
		resp.Header.Del("Retry-After")
	}
	return resp, nil
}

// FailFastOnConversion wraps a transport so that a conversion failure reaches the caller
// at once instead of after client-go's own retries (see conversionFailFast). New
// installs it on every client it builds; a client built elsewhere for custom resources
// adds it with cfg.Wrap(FailFastOnConversion).
func FailFastOnConversion(rt http.RoundTripper) http.RoundTripper {
	return conversionFailFast{next: rt}
}
