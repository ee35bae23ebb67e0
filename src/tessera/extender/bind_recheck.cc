// The bind's checks of the devices (docs/serve.md "Reservations and bind"): that the pod still
// carries the filter's decision (Scheduler::CheckDecided) and that its devices are still free
// (Scheduler::Recheck, which re-reserves them for the bind).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/mig_usage.h"
#include "tessera/extender/scheduler.h"

namespace tessera::extender {

absl::Status Scheduler::CheckDecided(const kube::Pod& pod, const ledger::PodAllocation& alloc) {
  const std::optional<ledger::Reservation> reserved = ledger_->ReservationOf(pod.meta.uid);
  if (!reserved) {
    return absl::OkStatus();  // expired or never seen (a restart): the re-check decides
  }
  const ledger::Decision decided{reserved->node, reserved->devices, reserved->init_count,
                                 reserved->mig};
  auto changed = [&](std::string_view key, const ledger::Decision& carried) {
    return absl::FailedPreconditionError(fmt::format(
        "pod {}: its allocation was changed since the filter decided ({} no longer states node "
        "{} [{}]; the pod says node {} [{}]); not binding it",
        pod.Key(), key, decided.node, ledger::DecisionText(decided),
        carried.node.empty() ? "-" : carried.node, ledger::DecisionText(carried)));
  };
  const ledger::Decision carried{alloc.node, alloc.devices, alloc.init_count, alloc.mig};
  if (!ledger::SameDecision(decided, carried)) {
    // Name the annotation that differs: the node, the MIG placements, else the devices.
    std::string_view key = device::kDevicesAllocatedAnnotation;
    if (alloc.node != decided.node) {
      key = device::kVgpuNodeAnnotation;
    } else if (!ledger::SameDecision(decided, ledger::Decision{alloc.node, decided.devices,
                                                               decided.init_count, alloc.mig})) {
      key = device::kMigAllocationsAnnotation;
    }
    return changed(key, carried);
  }
  // What the device plugin hands out: the to-allocate annotation, written with the same value.
  absl::StatusOr<device::PodDevices> pending =
      device::DecodePodDevices(pod.meta.annotations.Get(options_.vendor->ToAllocateAnnotation()));
  if (!pending.ok()) {
    return changed(options_.vendor->ToAllocateAnnotation(),
                   ledger::Decision{alloc.node, {}, 0, alloc.mig, /*unreadable=*/true});
  }
  if (const ledger::Decision handed{alloc.node, *std::move(pending), alloc.init_count, alloc.mig};
      !ledger::SameDecision(decided, handed)) {
    return changed(options_.vendor->ToAllocateAnnotation(), handed);
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Recheck(const kube::Pod& pod, std::string_view node,
                                const device::PodDevices& devices, int32_t init_count,
                                const std::vector<device::MigAllocation>& mig) {
  const std::string& uid = pod.meta.uid;
  MutexLock l(&decide_mu_);
  ledger_->Release(uid);
  filter_seq_.erase(uid);
  binding_.erase(uid);
  TESSERA_RETURN_IF_ERROR(ledger_->Reserve(uid, pod.meta.ns, pod.meta.name, node, devices,
                                           clock_->Now() + options_.reservation_ttl, init_count,
                                           mig));
  // From here until the bind fails or the pod is observed bound, expiry leaves it alone.
  binding_[uid] = absl::InfiniteFuture();
  std::vector<std::optional<device::NodeSnapshot>> snap = ledger_->Snapshot({node});
  auto refuse = [&](const std::string& message) {
    ledger_->Release(uid);
    return absl::FailedPreconditionError(message);
  };
  if (!snap[0] || !snap[0]->devices) {
    return refuse(
        fmt::format("node {} is not registered: devices of {} no longer free", node, pod.Key()));
  }
  const device::NodeDevices& nd = *snap[0]->devices;
  for (const device::ContainerDevices& container : devices) {
    for (const device::ContainerDevice& d : container) {
      const int i = nd.Find(d.uuid);
      if (i < 0) {
        return refuse(fmt::format("device {} of {} is no longer registered on node {}", d.uuid,
                                  pod.Key(), node));
      }
      const device::DeviceInfo& info = nd.devices[static_cast<size_t>(i)];
      const device::DeviceUsage& u = snap[0]->usage[static_cast<size_t>(i)];
      // A mig card's instances book their profile's core rounded up (seven 1g instances: 105 %
      // of 100), which the fit allows as HAMi's does; its bound is its placements, checked
      // below, so its cores are not bounded here.
      const bool mig_card = info.mode == "mig";
      if (u.used > info.count || u.usedmem > info.devmem ||
          (!mig_card && u.usedcores > info.devcore)) {
        return refuse(fmt::format(
            "devices of {} no longer free: device {} on node {} would hold {}/{} slots, "
            "{}/{} MiB, {}/{}% cores",
            pod.Key(), d.uuid, node, u.used, info.count, u.usedmem, info.devmem, u.usedcores,
            info.devcore));
      }
      if (!snap[0]->mig.empty()) {
        if (std::string conflict = device::MigCardConflict(snap[0]->mig[static_cast<size_t>(i)]);
            !conflict.empty()) {
          return refuse(fmt::format("devices of {} no longer free: device {} on node {}: {}",
                                    pod.Key(), d.uuid, node, conflict));
        }
      }
    }
  }
  // A placement may name a card none of the devices is on (HAMi's usage rebuild books it there):
  // that card must be free of overlaps too.
  for (const device::MigAllocation& a : mig) {
    const int i = nd.Find(a.gpu_uuid);
    if (i < 0 || snap[0]->mig.empty()) {
      continue;
    }
    if (std::string conflict = device::MigCardConflict(snap[0]->mig[static_cast<size_t>(i)]);
        !conflict.empty()) {
      return refuse(fmt::format("devices of {} no longer free: device {} on node {}: {}", pod.Key(),
                                a.gpu_uuid, node, conflict));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::extender
