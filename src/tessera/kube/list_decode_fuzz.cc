// Any bytes decode to a PodList / NodeList or an error, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tessera/kube/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tessera::kube::Decoder* decoder = new tessera::kube::Decoder();
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto pods = decoder->DecodePodList(json);
  auto nodes = decoder->DecodeNodeList(json);
  if ((!pods.ok() && pods.status().message().empty()) ||
      (!nodes.ok() && nodes.status().message().empty())) {
    std::abort();
  }
  return 0;
}
