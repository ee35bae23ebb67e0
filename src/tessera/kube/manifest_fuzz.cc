// Any text loads as manifests or gives an error naming the problem, never a crash or an escaped
// exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tessera/kube/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) {
    return 0;
  }
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::kube::Manifests> m = tessera::kube::LoadManifests(text, "fuzz.yaml");
  if (!m.ok() && m.status().message().empty()) {
    std::abort();
  }
  return 0;
}
