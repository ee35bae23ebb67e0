// Command kube-scheduler is the stock Kubernetes scheduler, built from its Go module
// (k8s.io/kubernetes/cmd/kube-scheduler/app) with no plugin added or changed, for Tessera's
// end-to-end tests.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
