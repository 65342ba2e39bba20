package migrate

import (
	"crypto/sha256"
	"encoding/base64"
)

// storageVersionHash is the storageVersionHash discovery reports for a resource stored at
// group/version/kind: the first 8 bytes of sha256("group/version/kind"), base64. It is the
// API server's formula (k8s.io/apiserver/pkg/endpoints/discovery.StorageVersionHash),
// restated here because importing that package links the API server's handlers, gRPC and
// the OpenTelemetry exporters into every binary that migrates; the test pins the two
// together.
func storageVersionHash(group, version, kind string) string {
	sum := sha256.Sum256([]byte(group + "/" + version + "/" + kind))
	return base64.StdEncoding.EncodeToString(sum[:8])
}
