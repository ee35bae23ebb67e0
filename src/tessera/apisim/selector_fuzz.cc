// Fuzzes the label and field selector parsers: any input yields a selector or an error, and a
// parsed selector can be matched.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/apisim/selector.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  tessera::apisim::Fields fields = {{"app", "web"}, {"n", "3"}, {"spec.nodeName", "a"}};
  auto l = tessera::apisim::LabelSelector::Parse(text);
  if (l.ok()) {
    (void)l->Matches(fields);
  }
  auto f = tessera::apisim::FieldSelector::Parse(text);
  if (f.ok()) {
    (void)f->Matches(fields);
  }
  return 0;
}
