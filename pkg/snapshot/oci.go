package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/retry"
)

// OCIScheme prefixes a snapshot's place in an OCI registry: oci://REGISTRY/REPOSITORY:TAG.
const OCIScheme = "oci://"

// IsOCI says whether ref names a snapshot in an OCI registry.
func IsOCI(ref string) bool { return strings.HasPrefix(ref, OCIScheme) }

// Registry says how to reach an OCI registry.
type Registry struct {
	// PlainHTTP speaks HTTP instead of HTTPS (a registry on loopback, say).
	PlainHTTP bool
	// Config is a registry credentials file (Docker's config.json format, as helm
	// registry login and docker login write it); "" reads Docker's (DOCKER_CONFIG, else
	// ~/.docker/config.json) and its credential helpers.
	Config string
}

func (r Registry) repository(ref string) (*remote.Repository, string, error) {
	name := strings.TrimPrefix(ref, OCIScheme)
	repo, err := remote.NewRepository(name)
	if err != nil {
		return nil, "", fmt.Errorf("%s: not an OCI reference (want oci://REGISTRY/REPOSITORY:TAG): %w", ref, err)
	}
	tag := repo.Reference.Reference
	if tag == "" {
		return nil, "", fmt.Errorf("%s: no tag (want oci://REGISTRY/REPOSITORY:TAG, for example :prod-eu)", ref)
	}
	var store credentials.Store
	if r.Config != "" {
		store, err = credentials.NewStore(r.Config, credentials.StoreOptions{})
	} else {
		store, err = credentials.NewStoreFromDocker(credentials.StoreOptions{})
	}
	if err != nil {
		return nil, "", fmt.Errorf("read registry credentials: %w", err)
	}
	repo.PlainHTTP = r.PlainHTTP
	repo.Client = &auth.Client{Client: retry.DefaultClient, Cache: auth.NewCache(), Credential: credentials.Credential(store)}
	return repo, tag, nil
}

// Push pushes the snapshot to ref (oci://REGISTRY/REPOSITORY:TAG) as an OCI artifact of
// type MediaType, whose one layer is the snapshot's JSON, and returns its digest.
func (r Registry) Push(ctx context.Context, s *Snapshot, ref string) (string, error) {
	repo, tag, err := r.repository(ref)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := s.Write(&b); err != nil {
		return "", err
	}
	layer, err := oras.PushBytes(ctx, repo, MediaType, b.Bytes())
	if err != nil {
		return "", fmt.Errorf("push the snapshot to %s: %w", ref, err)
	}
	manifest, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, MediaType, oras.PackManifestOptions{Layers: []ocispec.Descriptor{layer}})
	if err != nil {
		return "", fmt.Errorf("push the snapshot's manifest to %s: %w", ref, err)
	}
	if err := repo.Tag(ctx, manifest, tag); err != nil {
		return "", fmt.Errorf("tag the snapshot %s: %w", ref, err)
	}
	return manifest.Digest.String(), nil
}

// Pull reads the snapshot at ref (oci://REGISTRY/REPOSITORY:TAG).
func (r Registry) Pull(ctx context.Context, ref string) (*Snapshot, error) {
	repo, tag, err := r.repository(ref)
	if err != nil {
		return nil, err
	}
	_, raw, err := oras.FetchBytes(ctx, repo, tag, oras.DefaultFetchBytesOptions)
	if err != nil {
		return nil, fmt.Errorf("read the snapshot %s: %w", ref, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: not an OCI manifest: %w", ref, err)
	}
	if m.ArtifactType != MediaType {
		return nil, fmt.Errorf("%s is not a snapshot (artifact type %q, want %s): push one with the snapshot command's --push", ref, m.ArtifactType, MediaType)
	}
	for _, l := range m.Layers {
		if l.MediaType != MediaType {
			continue
		}
		rc, err := repo.Fetch(ctx, l)
		if err != nil {
			return nil, fmt.Errorf("read the snapshot %s: %w", ref, err)
		}
		defer func() { _ = rc.Close() }()
		s, err := Read(rc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		return s, nil
	}
	return nil, fmt.Errorf("%s holds no %s layer", ref, MediaType)
}
