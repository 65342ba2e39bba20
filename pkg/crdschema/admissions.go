package crdschema

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextv1client "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	"k8s.io/utils/lru"
	"k8s.io/utils/ptr"
)

// Admissions asks the API server whether it accepts incoming CRDs (Admit) and keeps its
// answers, so that one process asking again about the same change (check run twice, a
// controller's next pass, a review of many releases that share a chart) does not write
// again. An answer is kept by the identity of the live CRD as the API server stored it
// (UID and resourceVersion: any change to it gives a new key) and a digest of the
// incoming CRD's spec and metadata; an error is never kept. The digest of an incoming CRD
// is itself kept by pointer, as Judges keeps its hashes: an incoming CRD must not be
// modified once it has been asked about. Both are bounded (least recently used go first).
// It is safe for concurrent use; a nil *Admissions asks every time.
//
// An answer depends on the server's minor too, so an Admissions belongs to one cluster's
// clients, for as long as they live.
type Admissions struct {
	answers *lru.Cache // admissionKey -> *Refusal (nil: accepted)
	digests *lru.Cache // *apiextv1.CustomResourceDefinition (incoming) or "uid/rv" (live) -> digest
}

type admissionKey struct {
	uid, resourceVersion string
	spec, meta           digest
}

// digest is a SHA-256 sum.
type digest [sha256.Size]byte

// NewAdmissions keeps up to n answers (default 256).
func NewAdmissions(n int) *Admissions {
	if n <= 0 {
		n = 256
	}
	return &Admissions{answers: lru.New(n), digests: lru.New(2 * n)}
}

// Admit is the package's Admit through the kept answers: a CRD whose incoming spec is the
// live one's is not asked about (Unchanged), and an answer already given for the same
// live CRD and the same incoming CRD is given again.
func (a *Admissions) Admit(ctx context.Context, crds apiextv1client.CustomResourceDefinitionInterface, live, next *apiextv1.CustomResourceDefinition) (*Refusal, error) {
	if a == nil || live == nil || live.UID == "" || live.ResourceVersion == "" {
		return Admit(ctx, crds, live, next)
	}
	liveSpec, err := a.liveDigest(live)
	if err != nil {
		return Admit(ctx, crds, live, next)
	}
	nextSpec, nextMeta, err := a.nextDigests(next)
	if err != nil {
		return Admit(ctx, crds, live, next)
	}
	if liveSpec == nextSpec {
		return nil, nil
	}
	key := admissionKey{uid: string(live.UID), resourceVersion: live.ResourceVersion, spec: nextSpec, meta: nextMeta}
	if v, ok := a.answers.Get(key); ok {
		return v.(*Refusal), nil
	}
	r, err := ask(ctx, crds, live, next)
	if err != nil {
		return nil, err
	}
	a.answers.Add(key, r)
	return r, nil
}

// Unchanged reports whether next's spec, with the defaults the API server gives a CRD it
// stores, is the live CRD's spec. Applying such a CRD changes nothing the server
// validates, so there is nothing to ask it: Admit does not. A difference the server would
// erase on its own (a number written 1.0) counts as a change, so the server is asked.
func Unchanged(live, next *apiextv1.CustomResourceDefinition) bool {
	if live == nil || next == nil {
		return false
	}
	l, err1 := specDigest(live)
	n, err2 := specDigest(next)
	return err1 == nil && err2 == nil && l == n
}

func (a *Admissions) liveDigest(live *apiextv1.CustomResourceDefinition) (digest, error) {
	key := string(live.UID) + "/" + live.ResourceVersion
	if v, ok := a.digests.Get(key); ok {
		return v.(digest), nil
	}
	d, err := specDigest(live)
	if err == nil {
		a.digests.Add(key, d)
	}
	return d, err
}

// nextDigests are the digests of next's spec (as specDigest) and of its metadata.
func (a *Admissions) nextDigests(next *apiextv1.CustomResourceDefinition) (spec, meta digest, err error) {
	if v, ok := a.digests.Get(next); ok {
		d := v.([2]digest)
		return d[0], d[1], nil
	}
	if spec, err = specDigest(next); err != nil {
		return spec, meta, err
	}
	m := next.ObjectMeta
	m.UID, m.ResourceVersion, m.Generation, m.ManagedFields = "", "", 0, nil
	data, err := m.Marshal()
	if err != nil {
		return spec, meta, fmt.Errorf("digest CRD %s: %w", next.Name, err)
	}
	meta = sha256.Sum256(data)
	a.digests.Add(next, [2]digest{spec, meta})
	return spec, meta, nil
}

// specDigest is a digest of crd's spec with the defaults the API server gives a stored
// CRD (apiextensions v1 SetObjectDefaults_CustomResourceDefinition), so that an incoming
// CRD and the live CRD it was applied as have the same digest. It reads the generated
// protobuf encoding, whose maps are written in key order.
func specDigest(crd *apiextv1.CustomResourceDefinition) (digest, error) {
	spec := crd.Spec // a shallow copy: only its own fields are set below
	if spec.Names.Singular == "" {
		spec.Names.Singular = strings.ToLower(spec.Names.Kind)
	}
	if spec.Names.ListKind == "" && spec.Names.Kind != "" {
		spec.Names.ListKind = spec.Names.Kind + "List"
	}
	if spec.Conversion == nil {
		spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.NoneConverter}
	} else if w := spec.Conversion.Webhook; w != nil && w.ClientConfig != nil && w.ClientConfig.Service != nil && w.ClientConfig.Service.Port == nil {
		spec.Conversion = spec.Conversion.DeepCopy()
		spec.Conversion.Webhook.ClientConfig.Service.Port = ptr.To[int32](443)
	}
	data, err := spec.Marshal()
	if err != nil {
		return digest{}, fmt.Errorf("digest CRD %s: %w", crd.Name, err)
	}
	return sha256.Sum256(data), nil
}
