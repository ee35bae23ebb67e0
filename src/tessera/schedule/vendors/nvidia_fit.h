// File: tessera/schedule/vendors/nvidia_fit.h
//
// NVIDIA's fit rules (HAMi v2.10 pkg/device/nvidia Fit, docs/hami-protocol.md §4.3): the
// container's candidates walked from the end of the policy order, each checked in HAMi's order —
// health, cordon, card type and the nvidia.com/use-gputype selectors, NUMA binding, the
// nvidia.com/use-gpuuuid selectors, time slicing, mutex, the namespace quota, memory, cores,
// exclusivity, compute units, and on a card in mode "mig" a free instance (nvidia_mig.h) — and
// the first Nums that pass taken; under topology-aware every passing card is collected and the
// pair scores choose (nvidia_topology.h). The reason of each check: fit.h's Reason.
//
// Internal to tessera::schedule. Thread safety: as DeviceRules (device_rules.h).
#pragma once

#include <memory>

#include "tessera/schedule/device_rules.h"

namespace tessera::schedule {

std::unique_ptr<DeviceRules> NewNvidiaRules();

}  // namespace tessera::schedule
