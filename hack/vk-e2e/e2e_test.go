// Package vke2e runs virtual-kubelet's provider e2e suite, unmodified, against a node of
// ours. Built once into the control-plane cache by hack/build-control-plane.sh.
//
//	virtual-kubelet-e2e.test -kubeconfig upper.kubeconfig -namespace NS -node-name NODE -test.v
package vke2e

import (
	"flag"
	"testing"

	vke2e "github.com/virtual-kubelet/virtual-kubelet/test/e2e"
)

var (
	kubeconfig = flag.String("kubeconfig", "", "kubeconfig of the upper cluster the node is registered in")
	namespace  = flag.String("namespace", "default", "namespace of the test pods (the node's own pod lives there too)")
	nodeName   = flag.String("node-name", "", "name of the virtual node under test")
)

// TestEndToEnd runs every test of the suite: none is skipped.
func TestEndToEnd(t *testing.T) {
	if *nodeName == "" {
		t.Fatal("-node-name is required")
	}
	suite := vke2e.NewEndToEndTestSuite(vke2e.EndToEndTestSuiteConfig{
		Kubeconfig:     *kubeconfig,
		Namespace:      *namespace,
		NodeName:       *nodeName,
		ShouldSkipTest: func(string) bool { return false },
	})
	suite.Run(t)
}
