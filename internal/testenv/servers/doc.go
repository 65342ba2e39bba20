// Package servers serves what the code under test fetches from: Helm chart repositories
// over loopback HTTP (ServeRepo, ServeRepoBasicAuth, ChartRepo, whose contents can change
// while it serves), an in-process OCI registry (ServeOCI, with PushOCI and PushOCITag),
// and git repositories on disk (GitRepo). None needs a control plane; charts to serve
// are written with testenv.WriteChart, FixtureChart and Package.
//
// The HTTP servers and the registry run in the test process (net/http/httptest): the
// function each returns (stop, Close) stops it, and the files stay in the directory the
// test gave (usually t.TempDir, removed at cleanup). A GitRepo lives in t.TempDir. When
// the test binary is killed, the servers go with it, and only that directory can stay.
package servers
