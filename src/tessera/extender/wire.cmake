# The extender wire codec (k8s-protocol.md §1.1): ExtenderArgs, ExtenderBindingArgs and their
# results.
tessera_cc_library(
  NAME extender_wire
  HDRS wire.h
  SRCS wire.cc
  DEPS tessera::kube_decode tessera::kube_objects tessera::json simdjson::simdjson fmt::fmt absl::strings
       absl::status absl::statusor)

tessera_cc_test(NAME extender_wire_test SRCS wire_test.cc DEPS tessera::extender_wire)
tessera_cc_fuzz(NAME extender_args_fuzz SRCS extender_args_fuzz.cc DEPS tessera::extender_wire)
