// Placement-aware MIG fit. See mig_fit.h.
#include "tessera/schedule/mig_fit.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <string_view>
#include <tuple>

#include "fmt/format.h"

namespace tessera::schedule {
namespace {

using device::MigPlacement;
using device::MigProfile;

bool IsFree(const MigPlacement& candidate, std::span<const MigPlacement> occupied) {
  return std::none_of(occupied.begin(), occupied.end(),
                      [&](const MigPlacement& o) { return candidate.Overlaps(o); });
}

// HAMi's placement order: 1g./3g. profiles from the highest start, others from the lowest
// (stable for equal starts).
std::vector<MigPlacement> PlacementOrder(const MigProfile& profile) {
  std::vector<MigPlacement> out = profile.placements;
  std::string_view name = profile.name;
  const bool high = name.starts_with("1g.") || name.starts_with("3g.");
  std::stable_sort(out.begin(), out.end(), [high](const MigPlacement& a, const MigPlacement& b) {
    return high ? a.start > b.start : a.start < b.start;
  });
  return out;
}

// The first profile in HAMi's order with memory ≥ memreq and a free placement.
std::optional<size_t> HamiProfile(std::span<const MigProfile> profiles,
                                  std::span<const MigPlacement> occupied, int32_t memreq) {
  for (size_t i : MigProfileOrder(profiles)) {
    if (profiles[i].memory_mb >= memreq && MigPlaceable(profiles[i], occupied)) {
      return i;
    }
  }
  return std::nullopt;
}

// A headroom as one number with the same order (slice counts are below 8).
uint32_t Rank(const MigHeadroom& h) { return h.size * 8 + std::min(h.slices, 7U); }

}  // namespace

bool MigPlaceable(const MigProfile& profile, std::span<const MigPlacement> occupied) {
  return std::any_of(profile.placements.begin(), profile.placements.end(),
                     [&](const MigPlacement& p) { return IsFree(p, occupied); });
}

std::vector<size_t> MigProfileOrder(std::span<const MigProfile> profiles) {
  std::vector<size_t> order(profiles.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (profiles[a].memory_mb != profiles[b].memory_mb) {
      return profiles[a].memory_mb < profiles[b].memory_mb;
    }
    return profiles[a].slice_count < profiles[b].slice_count;
  });
  return order;
}

std::optional<MigChoice> SelectMigCandidateHami(std::span<const MigProfile> profiles,
                                                std::span<const MigPlacement> occupied,
                                                int32_t memreq) {
  std::optional<size_t> profile = HamiProfile(profiles, occupied, memreq);
  if (!profile.has_value()) {
    return std::nullopt;
  }
  for (const MigPlacement& p : PlacementOrder(profiles[*profile])) {
    if (IsFree(p, occupied)) {
      return MigChoice{*profile, p};
    }
  }
  return std::nullopt;  // unreachable: HamiProfile checked a placement is free
}

MigHeadroom HeadroomOf(std::span<const MigProfile> profiles,
                       std::span<const MigPlacement> occupied) {
  MigHeadroom best;
  for (const MigProfile& profile : profiles) {
    for (const MigPlacement& p : profile.placements) {
      if (IsFree(p, occupied)) {
        best = std::max(best, MigHeadroom{p.size, profile.slice_count});
      }
    }
  }
  return best;
}

std::optional<MigCardChoice> ChooseMigPlacement(std::span<const MigCard> cards, int32_t memreq) {
  std::optional<MigCardChoice> best;
  // Rank key: smaller is better (see mig_fit.h).
  using Key = std::tuple<int32_t, uint32_t, uint32_t>;
  std::optional<Key> best_key;
  std::vector<MigPlacement> trial;
  for (size_t c = 0; c < cards.size(); ++c) {
    const MigCard& card = cards[c];
    std::optional<size_t> profile = HamiProfile(card.profiles, card.occupied, memreq);
    if (!profile.has_value()) {
      continue;
    }
    const MigHeadroom before = HeadroomOf(card.profiles, card.occupied);
    for (const MigPlacement& p : PlacementOrder(card.profiles[*profile])) {
      if (!IsFree(p, card.occupied)) {
        continue;
      }
      trial.assign(card.occupied.begin(), card.occupied.end());
      trial.push_back(p);
      const MigHeadroom after = HeadroomOf(card.profiles, trial);
      Key key{card.profiles[*profile].memory_mb, Rank(before) - Rank(after), Rank(before)};
      if (!best_key.has_value() || key < *best_key) {
        best_key = key;
        best = MigCardChoice{c, MigChoice{*profile, p}};
      }
    }
  }
  return best;
}

std::string ExplainMigNoFit(std::span<const MigProfile> profiles,
                            std::span<const MigPlacement> occupied, int32_t memreq) {
  auto slices = [](const MigPlacement& p) {
    return p.size <= 1 ? fmt::format("slice {}", p.start)
                       : fmt::format("slices {}-{}", p.start, p.start + p.size - 1);
  };
  const std::vector<size_t> order = MigProfileOrder(profiles);
  const auto adequate = std::find_if(order.begin(), order.end(),
                                     [&](size_t i) { return profiles[i].memory_mb >= memreq; });
  if (adequate == order.end()) {
    if (order.empty()) {
      return "the card registers no MIG profile";
    }
    const MigProfile& largest = profiles[order.back()];
    return fmt::format("no profile has at least {} MiB (largest: {}, {} MiB)", memreq, largest.name,
                       largest.memory_mb);
  }
  const MigProfile& profile = profiles[*adequate];
  const std::vector<MigPlacement> placements = PlacementOrder(profile);
  const MigPlacement* best = nullptr;
  std::vector<MigPlacement> best_blockers;
  for (const MigPlacement& p : placements) {
    std::vector<MigPlacement> blockers;
    for (const MigPlacement& o : occupied) {
      if (p.Overlaps(o)) {
        blockers.push_back(o);
      }
    }
    if (best == nullptr || blockers.size() < best_blockers.size()) {
      best = &p;
      best_blockers = std::move(blockers);
    }
  }
  std::string head = fmt::format("{} ({} MiB): no free placement", profile.name, profile.memory_mb);
  if (best == nullptr) {
    return head + " (it has none)";
  }
  std::string names;
  for (const MigPlacement& b : best_blockers) {
    names += (names.empty() ? "" : ", ") + slices(b);
  }
  return fmt::format("{}; {} would be free without the instance{} at {}", head, slices(*best),
                     best_blockers.size() == 1 ? "" : "s", names);
}

std::vector<std::string> ExplainMigNode(const device::NodeSnapshot& node,
                                        const device::ContainerRequest& request) {
  std::vector<std::string> out;
  if (node.devices == nullptr) {
    return out;
  }
  const auto& devices = node.devices->devices;
  for (size_t i = 0; i < devices.size(); ++i) {
    const device::DeviceInfo& d = devices[i];
    if (d.mode != "mig") {
      continue;
    }
    int64_t memreq = 0;
    if (request.memreq > 0) {
      memreq = request.memreq;
    } else if (request.mem_percentage != device::kPercentageUnset) {
      memreq = int64_t{d.devmem} * request.mem_percentage / 100;
    }
    const auto mem = static_cast<int32_t>(std::min<int64_t>(memreq, INT32_MAX));
    std::span<const MigPlacement> occupied;
    if (i < node.mig.size()) {
      occupied = node.mig[i].occupied;
    }
    if (SelectMigCandidateHami(d.mig_profiles, occupied, mem).has_value()) {
      continue;
    }
    out.push_back(d.id + ": " + ExplainMigNoFit(d.mig_profiles, occupied, mem));
  }
  return out;
}

}  // namespace tessera::schedule
