add_executable(ledger_bench ledger_bench.cc
               ${PROJECT_SOURCE_DIR}/src/tessera/ledger/heap_counter.cc)
target_link_libraries(ledger_bench PRIVATE tessera::ledger tessera::schedule benchmark::benchmark_main)
target_compile_options(ledger_bench PRIVATE ${TESSERA_COPTS})
