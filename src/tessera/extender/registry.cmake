# The node registry: node informer deliveries → ledger registrations, the v2.5–v2.7 handshake.
tessera_cc_library(
  NAME extender_registry
  HDRS registry.h
  SRCS registry.cc
  DEPS tessera::device_vendor tessera::ledger tessera::kube_client tessera::quantity
       tessera::base fmt::fmt absl::strings absl::time)
tessera_cc_test(NAME extender_registry_test SRCS registry_test.cc
  DEPS tessera::extender_registry)
tessera_cc_test(NAME extender_registry_apisim_test SRCS registry_apisim_test.cc
  DEPS tessera::extender_registry tessera::apisim LABELS concurrency)
tessera_cc_test(NAME extender_registry_concurrency_test SRCS registry_concurrency_test.cc
  DEPS tessera::extender_registry LABELS concurrency)
tessera_cc_fuzz(NAME registry_fuzz SRCS registry_fuzz.cc
  DEPS tessera::extender_registry absl::strings)
