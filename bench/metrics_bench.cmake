# The /metrics body (tessera::metrics) rendered from a 5,000-node x 8-GPU, 100,000-pod snapshot.
add_executable(metrics_bench "${CMAKE_CURRENT_LIST_DIR}/metrics_bench.cc")
target_link_libraries(metrics_bench PRIVATE tessera::metrics benchmark::benchmark_main)
target_compile_options(metrics_bench PRIVATE ${TESSERA_COPTS})
