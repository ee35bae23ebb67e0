add_executable(request_bench request_bench.cc)
target_link_libraries(request_bench PRIVATE tessera::device_request benchmark::benchmark_main)
