// Fuzzes patch application: the input's first byte picks the patch type, the rest is the
// patch applied to a fixed pod. Any input yields a document or an error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/apisim/patch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  static constexpr tessera::apisim::PatchType kTypes[] = {tessera::apisim::PatchType::kJson,
                                                          tessera::apisim::PatchType::kMerge,
                                                          tessera::apisim::PatchType::kStrategic};
  constexpr std::string_view kPod =
      R"({"metadata":{"name":"p","labels":{"a":"1"},"finalizers":["f"]},)"
      R"("spec":{"containers":[{"name":"c","image":"x","env":[{"name":"E","value":"1"}]}]},)"
      R"("status":{"conditions":[{"type":"Ready","status":"True"}]}})";
  std::string_view patch(reinterpret_cast<const char*>(data) + 1, size - 1);
  (void)tessera::apisim::ApplyPatch(kTypes[data[0] % 3], kPod, patch);
  return 0;
}
