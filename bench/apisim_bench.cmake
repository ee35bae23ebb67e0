add_executable(apisim_bench apisim_bench.cc)
target_link_libraries(apisim_bench PRIVATE tessera::apisim benchmark::benchmark_main
  PkgConfig::HTTPLIB nlohmann_json::nlohmann_json fmt::fmt)
