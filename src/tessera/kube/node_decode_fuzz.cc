// Any bytes decode to a Node or an error naming the problem, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tessera/kube/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::kube::Node> pod = tessera::kube::DecodeNode(json);
  if (!pod.ok() && pod.status().message().empty()) {
    std::abort();
  }
  return 0;
}
