#The mutating admission webhook(POST / webhook; hami - protocol.md §6.3) : AdmissionReview in,
#AdmissionReview with a JSON Patch out.
tessera_cc_library(
    NAME extender_webhook HDRS webhook.h SRCS webhook.cc DEPS
        tessera::device_request tessera::device_codec tessera::device_config tessera::quantity tessera::kube_objects tessera::json
            nlohmann_json::nlohmann_json fmt::fmt absl::status absl::statusor absl::strings)

    tessera_cc_test(NAME extender_webhook_test SRCS webhook_test.cc DEPS tessera::extender_webhook
                        tessera::apisim nlohmann_json::nlohmann_json absl::strings)
        tessera_cc_fuzz(
            NAME admission_review_fuzz SRCS admission_review_fuzz.cc DEPS tessera::extender_webhook)
            tessera_cc_test(NAME extender_webhook_http_test SRCS webhook_http_test.cc DEPS
                                tessera::extender_webhook tessera::extender_http tessera::apisim
                                    PkgConfig::HTTPLIB OpenSSL::SSL OpenSSL::Crypto
                                        nlohmann_json::nlohmann_json absl::strings LABELS
                                            concurrency)
