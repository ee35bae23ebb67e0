# The filter decision (schedule::Decide) over 500 candidates of a 5,000-node x 8-GPU cluster.
add_executable(decision_bench "${CMAKE_CURRENT_LIST_DIR}/decision_bench.cc")
target_link_libraries(decision_bench PRIVATE tessera::schedule benchmark::benchmark_main)
target_compile_options(decision_bench PRIVATE ${TESSERA_COPTS})
