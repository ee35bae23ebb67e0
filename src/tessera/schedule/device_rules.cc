// The device kinds' registry. See device_rules.h.
#include "tessera/schedule/device_rules.h"

#include "tessera/schedule/vendors/ascend_fit.h"
#include "tessera/schedule/vendors/nvidia_fit.h"

namespace tessera::schedule {

DeviceKind KindOf(const device::ContainerRequest& request) {
  switch (request.family) {
    case device::DeviceFamily::kNvidia:
      return DeviceKind::kNvidia;
    case device::DeviceFamily::kAscend:
      return DeviceKind::kAscend;
  }
  return DeviceKind::kNvidia;
}

std::unique_ptr<DeviceRules> NewDeviceRules(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kNvidia:
      return NewNvidiaRules();
    case DeviceKind::kAscend:
      return NewAscendRules();
  }
  return NewNvidiaRules();
}

}  // namespace tessera::schedule
