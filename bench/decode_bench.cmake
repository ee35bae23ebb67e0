add_executable(decode_bench decode_bench.cc)
target_link_libraries(decode_bench PRIVATE tessera::kube_decode tessera::json fmt::fmt simdjson::simdjson
                      benchmark::benchmark_main)
target_compile_options(decode_bench PRIVATE ${TESSERA_COPTS})
