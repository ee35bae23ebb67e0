#include "tessera/sim/quota_oracle.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/core.h>

#include "tessera/device/codec.h"
#include "tessera/device/quantity.h"

namespace tessera::sim {

QuotaTruth ComputeQuotaTruth(const Truth& truth, const std::vector<kube::Pod>& pods,
                             const std::vector<kube::ResourceQuota>& quotas) {
  QuotaTruth out;
  for (const kube::ResourceQuota& q : quotas) {
    for (std::string_view resource : {kQuotaMemoryResource, kQuotaCoresResource}) {
      const std::string key = fmt::format("limits.{}", resource);
      const auto* value = q.hard.Find(key);
      if (value == nullptr) {
        continue;
      }
      absl::StatusOr<device::Quantity> quantity = device::ParseQuantity(value->view());
      absl::StatusOr<int64_t> v =
          quantity.ok() ? quantity->AsInt64() : absl::StatusOr<int64_t>(quantity.status());
      if (!v.ok()) {
        continue;  // not a whole number: no limit, as in HAMi
      }
      std::optional<int64_t>& limit = out[{q.meta.ns, std::string(resource)}].limit;
      limit = limit.has_value() ? std::min(*limit, *v) : *v;
    }
  }
  for (const kube::Pod& p : pods) {
    std::optional<device::PodDevices> held = HeldAllocation(p);
    if (!held.has_value()) {
      continue;
    }
    // Per device: {init peak, app sum} of memory and of cores.
    struct Card {
      int64_t init_mem = 0, init_cores = 0, app_mem = 0, app_cores = 0;
    };
    std::map<std::string, Card> cards;
    const size_t init = p.init_containers.size();
    for (size_t c = 0; c < held->size(); ++c) {
      for (const device::ContainerDevice& d : (*held)[c]) {
        auto it = truth.devices.find(d.uuid);
        if (it == truth.devices.end() || it->second.node != p.node_name) {
          continue;  // a device the node does not register holds nothing
        }
        Card& card = cards[d.uuid];
        if (c < init) {
          card.init_mem = std::max<int64_t>(card.init_mem, d.usedmem);
          card.init_cores = std::max<int64_t>(card.init_cores, d.usedcores);
        } else {
          card.app_mem += d.usedmem;
          card.app_cores += d.usedcores;
        }
      }
    }
    if (cards.empty()) {
      continue;
    }
    int64_t& mem = out[{p.meta.ns, std::string(kQuotaMemoryResource)}].used;
    int64_t& cores = out[{p.meta.ns, std::string(kQuotaCoresResource)}].used;
    for (const auto& [uuid, card] : cards) {
      mem += std::max(card.init_mem, card.app_mem);
      cores += std::max(card.init_cores, card.app_cores);
    }
  }
  return out;
}

absl::StatusOr<QuotaUsed> ParseQuotaUsed(std::string_view text) {
  QuotaUsed out;
  const absl::Status parsed = ForEachSample(
      text, "hami_resource_quota_used",
      [&](std::string_view line, std::string_view labels, std::string_view text_value) {
        std::optional<std::string> ns = SampleLabel(labels, "namespace");
        std::optional<std::string> resource = SampleLabel(labels, "quota_name");
        if (!ns.has_value() || !resource.has_value()) {
          return absl::InvalidArgumentError(
              fmt::format("quota sample without namespace or quota_name: {}", line));
        }
        const std::string value(text_value);
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (end == value.c_str() || !std::isfinite(v)) {
          return absl::InvalidArgumentError(fmt::format("bad sample value: {}", line));
        }
        out[{*ns, *resource}] = std::llround(v);
        return absl::OkStatus();
      });
  if (!parsed.ok()) {
    return parsed;
  }
  return out;
}

}  // namespace tessera::sim
