# Libraries linked into the tessera binary, one line per subcommand library.
target_link_libraries(tessera PRIVATE tessera::explain tessera::kube_manifest nlohmann_json::nlohmann_json)
target_link_libraries(tessera PRIVATE tessera::apisim)
target_link_libraries(tessera PRIVATE tessera::serve)
target_link_libraries(tessera PRIVATE tessera::serve_bench)
target_link_libraries(tessera PRIVATE tessera::explain_live)
target_link_libraries(tessera PRIVATE tessera::kube_api_calls)
target_link_libraries(tessera PRIVATE tessera::sim)
