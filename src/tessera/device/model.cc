#include "tessera/device/model.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace tessera::device {

bool NodeDevices::IsCordoned(std::string_view uuid) const {
  return std::binary_search(cordoned.begin(), cordoned.end(), uuid);
}

void NodeDevices::SortByIndex() {
  const size_t n = devices.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [this](size_t a, size_t b) {
    const DeviceInfo& x = devices[a];
    const DeviceInfo& y = devices[b];
    return x.index != y.index ? x.index < y.index : x.id < y.id;
  });
  std::vector<DeviceInfo> sorted;
  sorted.reserve(n);
  for (size_t i : order) {
    sorted.push_back(std::move(devices[i]));
  }
  devices = std::move(sorted);
  if (!pair_scores.empty()) {
    std::vector<int64_t> permuted(n * n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        permuted[i * n + j] = pair_scores[order[i] * n + order[j]];
      }
    }
    pair_scores = std::move(permuted);
  }
}

}  // namespace tessera::device
