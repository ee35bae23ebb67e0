// Any bytes decode to a ResourceQuota, a ResourceQuotaList (copied and in place) and a watch
// event on ResourceQuotas, or to an error naming the problem, never a crash. A decoded quota
// keeps only "limits.*" keys of spec.hard.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tessera/kube/decode.h"

namespace {

void CheckQuota(const tessera::kube::ResourceQuota& q) {
  for (const auto& [key, value] : q.hard) {
    if (!tessera::kube::QuotaLimitKey(key)) {
      std::abort();
    }
  }
}

template <typename T>
void CheckError(const absl::StatusOr<T>& r) {
  if (!r.ok() && r.status().message().empty()) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  static tessera::kube::Decoder* decoder = new tessera::kube::Decoder();
  auto quota = decoder->DecodeResourceQuota(json);
  CheckError(quota);
  if (quota.ok()) {
    CheckQuota(*quota);
  }
  auto list = decoder->DecodeResourceQuotaList(json);
  CheckError(list);
  std::string body(json);
  auto in_place = decoder->DecodeResourceQuotaListInPlace(&body);
  CheckError(in_place);
  if (list.ok() != in_place.ok()) {
    std::abort();
  }
  if (list.ok()) {
    for (const auto& q : list->items) {
      CheckQuota(q);
    }
    if (list->items != in_place->items) {
      std::abort();
    }
  }
  CheckError(decoder->DecodeWatchEvent<tessera::kube::ResourceQuota>(json));
  return 0;
}
