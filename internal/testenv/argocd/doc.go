// Package argocd runs Argo CD's real repo-server and application-controller, with a Redis
// of their own, as processes outside the cluster against a control plane of
// internal/testenv (Start, StartControllers), and holds the one definition of Argo CD's
// Application the tests share (application.go): ApplicationGVR, the Application a test
// reads, and ApplicationCRD, a stand-in for Argo CD's CRD where no Argo CD runs. RunHealth
// (lua.go) runs an argocd-cm health script as Argo CD v3 does, for the fast unit tests of
// deploy/argocd; test/argocd checks that it answers as the real Argo CD on the same
// objects.
//
// Start installs Argo CD's CRDs, its base config objects (argocd-cm and friends) and the
// `default` AppProject from bin/argocd (built by ./hack/testbin.sh --argocd), then starts
// redis-server, argocd-repo-server and argocd-application-controller on free loopback
// ports, with their homes, caches and logs in a directory under the control plane's
// (testenv.ControlPlane.Dir).
//
// ArgoCD.Stop, which Start registers with t.Cleanup, stops the controller, the
// repo-server and Redis (SIGTERM, then SIGKILL). It leaves the CRDs, config objects,
// AppProject and Applications in the control plane, and the files in the control plane's
// directory: the control plane's Stop removes both. If the test binary is killed, the
// processes die with it (internal/childproc); the control plane's directory stays in the
// temporary directory.
package argocd
