// Command kube-apiserver is the stock Kubernetes API server, built from its Go module
// (k8s.io/kubernetes/cmd/kube-apiserver/app) without changes, for Tessera's end-to-end tests.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
