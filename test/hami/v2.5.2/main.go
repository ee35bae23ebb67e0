// hami-scheduler-bench: HAMi v2.5.2's scheduler package (pkg/scheduler) behind a minimal HTTP
// front of our own, for tools/bench_controlplane.sh's HAMi column. It serves the extender verbs
// (/filter, /bind), /webhook and /healthz on one listener, as HAMi's own scheduler binary does,
// and nothing else (no metrics listener). Written for this benchmark; HAMi's code is used as a
// library only. See test/hami/README.md.
package main

import (
	"net/http"
	"os"

	"github.com/Project-HAMi/HAMi/pkg/device"
	"github.com/Project-HAMi/HAMi/pkg/scheduler"
	"github.com/Project-HAMi/HAMi/pkg/scheduler/config"
	"github.com/Project-HAMi/HAMi/pkg/scheduler/routes"
	"github.com/julienschmidt/httprouter"
	"k8s.io/klog/v2"
)

func main() {
	// HAMi's device packages register their flags (and klog's) on this set, among them
	// --device-config-file; ours go on the same set.
	fs := device.GlobalFlagSet()
	fs.StringVar(&config.HTTPBind, "http_bind", "127.0.0.1:8080", "listen address")
	fs.StringVar(&config.SchedulerName, "scheduler-name", "hami-scheduler", "the schedulerName the webhook sets")
	cert := fs.String("cert_file", "", "TLS certificate (empty: plain HTTP)")
	key := fs.String("key_file", "", "TLS key")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}

	device.InitDevices()
	s := scheduler.NewScheduler()
	s.Start()
	defer s.Stop()
	go s.RegisterFromNodeAnnotations()

	r := httprouter.New()
	r.POST("/filter", routes.PredicateRoute(s))
	r.POST("/bind", routes.Bind(s))
	r.POST("/webhook", routes.WebHookRoute())
	r.GET("/healthz", routes.HealthzRoute())
	klog.Infof("hami-scheduler-bench (HAMi v2.5.2) listening on %s", config.HTTPBind)
	var err error
	if *cert != "" {
		err = http.ListenAndServeTLS(config.HTTPBind, *cert, *key, r)
	} else {
		err = http.ListenAndServe(config.HTTPBind, r)
	}
	klog.Fatal(err)
}
