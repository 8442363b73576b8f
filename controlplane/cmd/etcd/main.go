// Command etcd runs the etcd server built from go.etcd.io/etcd/server/v3 at the
// version kube-apiserver v1.35 is tested with, so the test control plane needs no
// download beyond the Go module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
