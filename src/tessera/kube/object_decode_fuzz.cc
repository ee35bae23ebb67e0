// Any bytes decode to a Lease, a Status, or a PodList / NodeList parsed in place, or to an error
// naming the problem; never a crash. The in-place list decode must agree with the copying one.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tessera/kube/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tessera::kube::Decoder* decoder = new tessera::kube::Decoder();
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto lease = decoder->DecodeLease(json);
  auto status = decoder->DecodeStatus(json);
  if ((!lease.ok() && lease.status().message().empty()) ||
      (!status.ok() && status.status().message().empty())) {
    std::abort();
  }
  auto pods = decoder->DecodePodList(json);
  std::string body(json);
  auto pods_in_place = decoder->DecodePodListInPlace(&body);
  if (pods.ok() != pods_in_place.ok() ||
      (pods.ok() && (pods->meta != pods_in_place->meta || pods->items != pods_in_place->items))) {
    std::abort();
  }
  body.assign(json);
  auto nodes_in_place = decoder->DecodeNodeListInPlace(&body);
  if (!nodes_in_place.ok() && nodes_in_place.status().message().empty()) {
    std::abort();
  }
  return 0;
}
