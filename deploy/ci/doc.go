// Package ci holds the tests of the CI integrations in deploy/: the GitHub Action
// (deploy/github-action) and the GitLab CI template (deploy/gitlab), whose logic is the
// script deploy/ci/upgradeguard-review.sh. The tests run that script as each platform
// would, against a local HTTP server that speaks the platform's REST API, with a real
// review of a real Git repository against a real API server.
package ci
