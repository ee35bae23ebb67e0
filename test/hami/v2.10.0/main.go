// hami-scheduler-bench: HAMi v2.10.0's scheduler package (pkg/scheduler) behind a minimal HTTP
// front of our own, for tools/bench_controlplane.sh's HAMi column. It serves the extender verbs
// (/filter, /bind), /webhook, /healthz and /readyz on one listener, as HAMi's own scheduler
// binary does; no leader election (one replica), no metrics listener. Written for this
// benchmark; HAMi's code is used as a library only. See test/hami/README.md.
package main

import (
	"net/http"
	"os"
	"time"

	"github.com/Project-HAMi/HAMi/pkg/scheduler"
	"github.com/Project-HAMi/HAMi/pkg/scheduler/config"
	"github.com/Project-HAMi/HAMi/pkg/scheduler/routes"
	"github.com/Project-HAMi/HAMi/pkg/util/client"
	"github.com/Project-HAMi/HAMi/pkg/util/nodelock"
	"github.com/julienschmidt/httprouter"
	"k8s.io/klog/v2"
)

func main() {
	// HAMi's device packages register their flags (and klog's) on this set, among them
	// --device-config-file; ours go on the same set.
	fs := config.GlobalFlagSet()
	fs.StringVar(&config.HTTPBind, "http_bind", "127.0.0.1:8080", "listen address")
	fs.StringVar(&config.SchedulerName, "scheduler-name", "hami-scheduler", "the schedulerName the webhook sets")
	qps := fs.Float64("kube-qps", float64(client.DefaultQPS), "client-side QPS towards kube-apiserver (HAMi's default)")
	burst := fs.Int("kube-burst", client.DefaultBurst, "client-side burst")
	cert := fs.String("cert_file", "", "TLS certificate (empty: plain HTTP)")
	key := fs.String("key_file", "", "TLS key")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	// HAMi's own defaults for what its command line would otherwise set.
	config.NodeLockTimeout = 5 * time.Minute
	config.NodeLockRetryTimeout = 28 * time.Second
	config.ForceOverwriteDefaultScheduler = true
	nodelock.NodeLockTimeout = config.NodeLockTimeout
	client.InitGlobalClient(client.WithQPS(float32(*qps)), client.WithBurst(*burst))
	config.InitDevices()
	var err error
	if config.HostName, err = os.Hostname(); err != nil {
		klog.Fatal(err)
	}

	s := scheduler.NewScheduler()
	go s.RegisterFromNodeAnnotations()
	if err := s.Start(); err != nil {
		klog.Fatal(err)
	}
	defer s.Stop()

	r := httprouter.New()
	r.POST("/filter", routes.PredicateRoute(s))
	r.POST("/bind", routes.Bind(s))
	r.POST("/webhook", routes.WebHookRoute())
	r.GET("/healthz", routes.HealthzRoute())
	r.GET("/readyz", routes.ReadyzRoute(s))
	klog.Infof("hami-scheduler-bench (HAMi v2.10.0) listening on %s", config.HTTPBind)
	srv := &http.Server{Addr: config.HTTPBind, Handler: r, ReadHeaderTimeout: 15 * time.Second}
	if *cert != "" {
		err = srv.ListenAndServeTLS(*cert, *key)
	} else {
		err = srv.ListenAndServe()
	}
	klog.Fatal(err)
}
