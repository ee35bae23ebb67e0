// The device kinds' registry. See device_rules.h.
#include "tessera/schedule/device_rules.h"

#include "tessera/schedule/vendors/nvidia_fit.h"

namespace tessera::schedule {

DeviceKind KindOf(std::string_view /*request_type*/) { return DeviceKind::kNvidia; }

std::unique_ptr<DeviceRules> NewDeviceRules(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kNvidia:
      return NewNvidiaRules();
  }
  return NewNvidiaRules();
}

}  // namespace tessera::schedule
