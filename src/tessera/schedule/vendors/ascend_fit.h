// File: tessera/schedule/vendors/ascend_fit.h
//
// Huawei Ascend's fit rules (HAMi v2.10 pkg/device/ascend Fit): the pod's hami-core mode needs
// the node's consent (NodeDevices::hami_core_allowed, else 1/N ModeNotFit); the candidates are
// walked from the end of the policy order, each checked in HAMi's order — health, card type
// (exact: an Ascend910B4 request never takes an Ascend910B4-1 card, where HAMi's substring
// match would), the hami.io/use-<chip>-uuid selectors, time slicing, mutex, memory, cores (a
// card counts 100 in hami-core mode), exclusivity, compute units — and the first Nums taken.
// Topology: on a 910 chip whose candidates all carry custominfo.NetworkID every passing card is
// collected, and for several cards the largest same-network groups are taken first; a 910C
// request of several cards takes whole module pairs (index / 2), and fails with its reasons
// counted against the request (HAMi's "n/<request> ..."). Where HAMi breaks ties in Go map order
// (groups or pairs of equal size) Tessera takes them in visiting order (docs/compatibility.md).
//
// Internal to tessera::schedule. Thread safety: as DeviceRules (device_rules.h).
#pragma once

#include <memory>

#include "tessera/schedule/device_rules.h"

namespace tessera::schedule {

std::unique_ptr<DeviceRules> NewAscendRules();

}  // namespace tessera::schedule
