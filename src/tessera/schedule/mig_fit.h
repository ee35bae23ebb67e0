// File: tessera/schedule/mig_fit.h
//
// Placement-aware MIG fit: which profile and placement a MIG request gets on a card in "mig"
// mode, given the instances already there. A profile fits only where one of its placements
// overlaps no occupied placement (never a sum of free slices).
//
// Two choosers:
// - SelectMigCandidateHami is HAMi v2.10's rule (device.go:selectMigCandidate with
//   mig_topology.go:selectMigPlacement): the smallest adequate profile that has a free
//   placement, its placements tried highest start first for "1g."/"3g." names, lowest first
//   otherwise.
// - ChooseMigPlacement is Tessera's: the same profile as HAMi's rule (so memory accounting and
//   what the container gets do not change), but among its free placements, and across cards,
//   the one that loses the least headroom (MigHeadroom: the largest profile still placeable).
//   docs/scheduling.md "MIG" says where the two differ.
//
// The pod fit (fit.h) uses ChooseMigPlacement on the one card its walk reaches; explain uses
// ExplainMigNode.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/device/model.h"

namespace tessera::schedule {

// A chosen instance: profiles[profile] at `placement`.
struct MigChoice {
  size_t profile = 0;
  device::MigPlacement placement;

  friend bool operator==(const MigChoice&, const MigChoice&) = default;
};

// True when some placement of `profile` overlaps none of `occupied`.
bool MigPlaceable(const device::MigProfile& profile,
                  std::span<const device::MigPlacement> occupied);

// The profile indices in HAMi's trial order: memory_mb ascending, then slice_count ascending,
// stable (ties keep registration order).
std::vector<size_t> MigProfileOrder(std::span<const device::MigProfile> profiles);

// HAMi v2.10's choice for a request of `memreq` MiB, or nullopt (CardMigTopologyInfeasible).
std::optional<MigChoice> SelectMigCandidateHami(std::span<const device::MigProfile> profiles,
                                                std::span<const device::MigPlacement> occupied,
                                                int32_t memreq);

// How large an instance the card could still create: over the profiles with a free placement,
// the largest (placement size, slice_count), compared in that order; {0, 0} when none.
struct MigHeadroom {
  uint32_t size = 0;
  uint32_t slices = 0;
  friend bool operator==(const MigHeadroom&, const MigHeadroom&) = default;
  friend bool operator<(const MigHeadroom& a, const MigHeadroom& b) {
    return a.size != b.size ? a.size < b.size : a.slices < b.slices;
  }
};
MigHeadroom HeadroomOf(std::span<const device::MigProfile> profiles,
                       std::span<const device::MigPlacement> occupied);

// One candidate card: its registered profiles and the placements in use.
struct MigCard {
  std::span<const device::MigProfile> profiles;
  std::span<const device::MigPlacement> occupied;
};

// Tessera's choice among `cards` (nullopt when no card fits): on each card the profile is HAMi's
// (SelectMigCandidateHami's); candidates (card, free placement of that profile) are ranked by
// 1. the profile's memory_mb, smaller first (less waste);
// 2. the headroom lost by placing there, smaller first;
// 3. the card's headroom before, smaller first (fill a used card before breaking a whole one);
// 4. card index, then HAMi's placement order.
struct MigCardChoice {
  size_t card = 0;
  MigChoice choice;
  friend bool operator==(const MigCardChoice&, const MigCardChoice&) = default;
};
std::optional<MigCardChoice> ChooseMigPlacement(std::span<const MigCard> cards, int32_t memreq);

// Why a request of `memreq` MiB fits no placement of a card (for explain), one line:
// - "no profile has at least N MiB (largest: 7g.40gb, 40192 MiB)" when none is large enough;
// - otherwise, for the smallest adequate profile (HAMi's order), the placement that the fewest
//   occupied instances block, and those instances: "3g.20gb (19968 MiB): no free placement;
//   slices 0-3 would be free without the instance at slices 0-1".
// Precondition: SelectMigCandidateHami(profiles, occupied, memreq) is nullopt.
std::string ExplainMigNoFit(std::span<const device::MigProfile> profiles,
                            std::span<const device::MigPlacement> occupied, int32_t memreq);

// For a node that failed a MIG request (CardMigTopologyInfeasible), one line per "mig" card on
// which no placement of an adequate profile is free for `request` (its memory resolved per card
// as the fit does): "<uuid>: <ExplainMigNoFit>". Cards where a placement is free (they failed
// another check) are left out.
std::vector<std::string> ExplainMigNode(const device::NodeSnapshot& node,
                                        const device::ContainerRequest& request);

}  // namespace tessera::schedule
