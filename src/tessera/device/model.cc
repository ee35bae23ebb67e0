#include "tessera/device/model.h"

#include <algorithm>

namespace tessera::device {

bool NodeDevices::IsCordoned(std::string_view uuid) const {
  return std::binary_search(cordoned.begin(), cordoned.end(), uuid);
}

}  // namespace tessera::device
