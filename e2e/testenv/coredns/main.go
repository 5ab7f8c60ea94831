// The cluster DNS of the control plane that `make test` starts (scripts/k8s-testenv.sh):
// CoreDNS itself, built with only the plugins the test cluster's Corefile uses. Pods on
// the real node resolve `<pod>.<service>.<namespace>.svc.cluster.local` through it, as
// they would in any cluster.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func init() {
	// The plugins' order in a server block, as CoreDNS's plugin.cfg would set it.
	dnsserver.Directives = []string{"bind", "errors", "log", "kubernetes"}
}

func main() {
	coremain.Run()
}
