# tessera::extender_node_lock — HAMi's node lock over the API client (node_lock.h).
tessera_cc_library(
  NAME extender_node_lock
  HDRS node_lock.h
  SRCS node_lock.cc
  DEPS tessera::kube_client tessera::device_codec tessera::base absl::status absl::statusor
       absl::time fmt::fmt)

# tessera::extender_scheduler — the filter and bind logic of `tessera serve` (scheduler.h). It
# uses only the plain types of wire.h (no codec), so it does not link the wire library.
tessera_cc_library(
  NAME extender_scheduler
  HDRS scheduler.h
  SRCS scheduler.cc
  DEPS tessera::extender_node_lock tessera::cluster tessera::ledger tessera::schedule
       tessera::device_vendor tessera::kube_client tessera::kube_objects tessera::base
       absl::flat_hash_map absl::flat_hash_set absl::status absl::strings absl::time fmt::fmt Threads::Threads)

tessera_cc_test(NAME extender_node_lock_test SRCS node_lock_test.cc
  DEPS tessera::extender_node_lock tessera::apisim tessera::kube_client LABELS concurrency)
tessera_cc_test(NAME extender_scheduler_test SRCS scheduler_test.cc
  DEPS tessera::extender_scheduler tessera::apisim tessera::kube_client tessera::cluster
       nlohmann_json::nlohmann_json
  LABELS concurrency)
