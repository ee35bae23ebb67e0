add_executable(informer_bench informer_bench.cc)
target_link_libraries(informer_bench PRIVATE tessera::kube_client benchmark::benchmark_main)
