add_executable(kube_transport_bench kube_transport_bench.cc)
target_link_libraries(kube_transport_bench PRIVATE tessera::kube_transport PkgConfig::HTTPLIB
  benchmark::benchmark_main)
