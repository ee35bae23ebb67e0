// Any bytes decode to a PodDisruptionBudget (or a list of them) or to an error naming the
// problem, never a crash; a decoded selector becomes a selector string or an InvalidArgument, and
// the string holds only what a label selector's grammar allows.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tessera/kube/decode.h"
#include "tessera/kube/pod_disruption_budget.h"

namespace {

void Check(const tessera::kube::PodDisruptionBudget& pdb) {
  if (!std::is_sorted(pdb.disrupted_pods.begin(), pdb.disrupted_pods.end())) {
    std::abort();
  }
  if (!pdb.selector) {
    return;
  }
  absl::StatusOr<std::string> text = tessera::kube::SelectorText(*pdb.selector);
  if (!text.ok()) {
    if (text.status().code() != absl::StatusCode::kInvalidArgument ||
        text.status().message().empty()) {
      std::abort();
    }
    return;
  }
  for (char c : *text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string_view("._-/=!,() ").find(c) != std::string_view::npos;
    if (!ok) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tessera::kube::Decoder* decoder = new tessera::kube::Decoder();
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto pdb = decoder->DecodePodDisruptionBudget(json);
  if (!pdb.ok() && pdb.status().message().empty()) {
    std::abort();
  }
  if (pdb.ok()) {
    Check(*pdb);
  }
  auto list = decoder->DecodePodDisruptionBudgetList(json);
  if (!list.ok() && list.status().message().empty()) {
    std::abort();
  }
  if (list.ok()) {
    for (const auto& item : list->items) {
      Check(item);
    }
  }
  return 0;
}
