// Any bytes decode to a Pod or an error naming the problem, never a crash. A decoded pod keeps
// only the labels and annotations the projection tracks, in sorted order with unique keys.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tessera/kube/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::kube::Pod> pod = tessera::kube::DecodePod(json);
  if (!pod.ok() && pod.status().message().empty()) {
    std::abort();
  }
  if (pod.ok()) {
    for (const tessera::kube::StringMap* map : {&pod->meta.labels, &pod->meta.annotations}) {
      std::string_view previous;
      bool first = true;
      for (const auto& [key, value] : *map) {
        if (!tessera::kube::TrackedAnnotation(key) || (!first && !(previous < key))) {
          std::abort();
        }
        previous = key;
        first = false;
      }
    }
  }
  return 0;
}
