# The extender's HTTP(S) server and its metrics listener, over tessera::http.
tessera_cc_library(
  NAME extender_http
  HDRS http_server.h
  SRCS http_server.cc
  DEPS tessera::extender_wire tessera::base tessera::http OpenSSL::SSL OpenSSL::Crypto
       absl::status absl::statusor absl::strings absl::time fmt::fmt Threads::Threads)

tessera_cc_test(NAME extender_http_test SRCS http_server_test.cc
  DEPS tessera::extender_http tessera::apisim PkgConfig::HTTPLIB OpenSSL::SSL OpenSSL::Crypto
  LABELS concurrency)
