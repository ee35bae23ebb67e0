// The MIG geometry tables (NVIDIA Multi-Instance GPU User Guide). See mig_geometry.h.
#include "tessera/device/mig_geometry.h"

#include <algorithm>
#include <array>

namespace tessera::device {
namespace {

// Placement starts shared by the 8-memory-slice GPUs (A100, H100, H200): `nvidia-smi mig -lgipp`
// lists {0..6}:1 for 1-slice profiles, {0,2,4,6}:2 for 1g with 2 memory slices, {0,2,4}:2 for
// 2g, {0,4}:4 for 3g, {0}:4 for 4g and {0}:8 for 7g.
constexpr std::array<uint32_t, 7> kStarts1 = {0, 1, 2, 3, 4, 5, 6};
constexpr std::array<uint32_t, 4> kStarts1g2 = {0, 2, 4, 6};
constexpr std::array<uint32_t, 3> kStarts2g = {0, 2, 4};
constexpr std::array<uint32_t, 2> kStarts3g = {0, 4};
constexpr std::array<uint32_t, 1> kStarts0 = {0};

// The seven profiles of an 8-slice GPU, named for its memory. Order: smallest memory first,
// then fewer compute slices (the order in which HAMi's scheduler tries them).
constexpr std::array<MigGeometryProfile, 7> EightSliceProfiles(
    std::string_view p1, std::string_view p1me, std::string_view p1x2, std::string_view p2,
    std::string_view p3, std::string_view p4, std::string_view p7) {
  return {{
      {p1, 1, 1, 7, kStarts1},
      {p1me, 1, 1, 1, kStarts1},
      {p1x2, 1, 2, 4, kStarts1g2},
      {p2, 2, 2, 3, kStarts2g},
      {p3, 3, 4, 2, kStarts3g},
      {p4, 4, 4, 1, kStarts0},
      {p7, 7, 8, 1, kStarts0},
  }};
}

constexpr auto kProfilesA100x40 = EightSliceProfiles("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb",
                                                     "3g.20gb", "4g.20gb", "7g.40gb");
constexpr auto kProfilesA100x80 = EightSliceProfiles("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb",
                                                     "3g.40gb", "4g.40gb", "7g.80gb");
constexpr auto kProfilesH100x80 = EightSliceProfiles("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb",
                                                     "3g.40gb", "4g.40gb", "7g.80gb");
constexpr auto kProfilesH200 = EightSliceProfiles("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb",
                                                  "3g.71gb", "4g.71gb", "7g.141gb");

// NVML names: "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100-SXM4-80GB",
// "NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200",
// "NVIDIA H200 NVL".
constexpr std::array<std::string_view, 3> kNamesA100x40 = {"A100-SXM4-40GB", "A100-PCIE-40GB",
                                                           "A100-40GB"};
constexpr std::array<std::string_view, 3> kNamesA100x80 = {"A100-SXM4-80GB", "A100 80GB",
                                                           "A100-80GB"};
constexpr std::array<std::string_view, 4> kNamesH100x80 = {"H100 80GB", "H100-SXM5-80GB",
                                                           "H100-80GB", "H100 PCIe"};
constexpr std::array<std::string_view, 1> kNamesH200 = {"H200"};

constexpr std::array<MigGpuModel, 4> kModels = {{
    {"A100-40GB", 40960, kNamesA100x40, kProfilesA100x40},
    {"A100-80GB", 81920, kNamesA100x80, kProfilesA100x80},
    {"H100-80GB", 81559, kNamesH100x80, kProfilesH100x80},
    {"H200", 143771, kNamesH200, kProfilesH200},
}};

}  // namespace

std::span<const MigGpuModel> MigGpuModels() { return kModels; }

const MigGpuModel* FindMigGpuModel(std::string_view type) {
  for (const MigGpuModel& m : kModels) {
    for (std::string_view fragment : m.type_fragments) {
      if (type.find(fragment) != std::string_view::npos) {
        return &m;
      }
    }
  }
  return nullptr;
}

std::vector<MigProfile> MigProfilesOf(const MigGpuModel& model,
                                      std::span<const std::string_view> names) {
  std::vector<MigProfile> out;
  for (const MigGeometryProfile& g : model.profiles) {
    if (!names.empty() && std::find(names.begin(), names.end(), g.name) == names.end()) {
      continue;
    }
    MigProfile p;
    p.name = std::string(g.name);
    p.memory_mb = static_cast<int32_t>(int64_t{model.memory_mib} * g.memory_slices / 8);
    p.core = static_cast<int32_t>((g.compute_slices * 100 + 6) / 7);
    p.slice_count = g.compute_slices;
    for (uint32_t start : g.starts) {
      p.placements.push_back(MigPlacement{start, g.memory_slices});
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace tessera::device
