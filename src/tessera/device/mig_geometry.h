// File: tessera/device/mig_geometry.h
//
// The MIG geometries of the GPU models Tessera knows: for each model its GPU-instance profiles
// and their placements, as data. Source: NVIDIA's "Multi-Instance GPU User Guide": its table of
// GPU-instance profiles per supported GPU (name, fraction of memory and SMs, instance count)
// and the placements `nvidia-smi mig -lgipp` lists in its examples (starts and sizes in memory
// slices, 8 per GPU). docs/mig.md reproduces the tables.
//
// A v2.10 device plugin registers the NVML values of its card (DeviceInfo::mig_profiles), which
// are what the scheduler uses; these tables serve as fixtures for fit tests and the simulator,
// and to recognise a card's geometry where a registration carries none (v2.5.2).
//
// Thread safety: immutable static data.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tessera/device/model.h"

namespace tessera::device {

// One GPU-instance profile of a model.
struct MigGeometryProfile {
  std::string_view name;             // "3g.20gb"; "+me" names the media-extension variant
  uint32_t compute_slices;           // the "Ng" of the name, of 7
  uint32_t memory_slices;            // of 8; also the size of each placement
  uint32_t max_instances;            // how many can exist at once on an otherwise empty GPU
  std::span<const uint32_t> starts;  // placement starts, ascending
};

// One GPU model: the NVML name fragments that identify it and its profiles, smallest first.
struct MigGpuModel {
  std::string_view model;  // "A100-40GB", "A100-80GB", "H100-80GB", "H200"
  int32_t memory_mib;      // the card's total memory as the plugin registers devmem
  std::span<const std::string_view> type_fragments;  // any one a substring of the card type
  std::span<const MigGeometryProfile> profiles;
};

// Every model, in a fixed order.
std::span<const MigGpuModel> MigGpuModels();

// The first model one of whose fragments is a substring of `type` (for example
// "NVIDIA A100-SXM4-40GB"), or nullptr.
const MigGpuModel* FindMigGpuModel(std::string_view type);

// The profiles a v2.10 plugin on `model` registers for the allowlisted `names` (all when empty),
// in the table's order: placements from the table; memory_mb = memory_mib × memory slices / 8
// (NVML reports slightly less; the fixtures only need the order); core = ⌈compute slices × 100 /
// 7⌉ (the plugin's SM ratio for the whole-slice counts). Names the model lacks are skipped, as
// the plugin skips a profile NVML does not know.
std::vector<MigProfile> MigProfilesOf(const MigGpuModel& model,
                                      std::span<const std::string_view> names = {});

}  // namespace tessera::device
