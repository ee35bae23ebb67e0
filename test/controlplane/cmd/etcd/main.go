// Command etcd is the stock etcd server (go.etcd.io/etcd/server/v3/etcdmain), at the version
// k8s.io/kubernetes requires, for Tessera's end-to-end tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
