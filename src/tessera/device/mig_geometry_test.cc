// Tests of the MIG geometry tables against facts of NVIDIA's MIG user guide that the tables do
// not state directly: each profile's instance count is the number of its placements that fit
// together, memory and compute never exceed the GPU, and NVML names find their model.
#include "tessera/device/mig_geometry.h"

#include <functional>
#include <string>

#include "gtest/gtest.h"

namespace tessera::device {
namespace {

// The largest set of pairwise non-overlapping placements of one profile.
uint32_t MaxDisjoint(const MigGeometryProfile& p) {
  std::vector<MigPlacement> chosen;
  std::function<uint32_t(size_t)> best = [&](size_t i) -> uint32_t {
    if (i == p.starts.size()) {
      return 0;
    }
    uint32_t skip = best(i + 1);
    MigPlacement cand{p.starts[i], p.memory_slices};
    for (const MigPlacement& c : chosen) {
      if (c.Overlaps(cand)) {
        return skip;
      }
    }
    chosen.push_back(cand);
    uint32_t take = 1 + best(i + 1);
    chosen.pop_back();
    return std::max(skip, take);
  };
  return best(0);
}

TEST(MigGeometryTest, InstanceCountsFollowFromThePlacements) {
  ASSERT_EQ(MigGpuModels().size(), 4U);
  for (const MigGpuModel& m : MigGpuModels()) {
    ASSERT_EQ(m.profiles.size(), 7U) << m.model;
    for (const MigGeometryProfile& p : m.profiles) {
      SCOPED_TRACE(std::string(m.model) + " " + std::string(p.name));
      EXPECT_LE(p.compute_slices, 7U);
      for (uint32_t start : p.starts) {
        EXPECT_LE(start + p.memory_slices, 8U);
      }
      // "+me" profiles exist once (one media engine set); the others fill the GPU.
      const bool media = std::string_view(p.name).ends_with("+me");
      EXPECT_EQ(p.max_instances, media ? 1U : MaxDisjoint(p));
      EXPECT_EQ(p.compute_slices, std::stoul(std::string(p.name)));
    }
  }
}

TEST(MigGeometryTest, NvmlNamesFindTheirModel) {
  const std::pair<const char*, const char*> kNames[] = {
      {"NVIDIA A100-SXM4-40GB", "A100-40GB"},
      {"NVIDIA A100-PCIE-40GB", "A100-40GB"},
      {"NVIDIA A100-SXM4-80GB", "A100-80GB"},
      {"NVIDIA A100 80GB PCIe", "A100-80GB"},
      {"NVIDIA H100 80GB HBM3", "H100-80GB"},
      {"NVIDIA H100 PCIe", "H100-80GB"},
      {"NVIDIA H200", "H200"},
      {"NVIDIA H200 NVL", "H200"},
  };
  for (const auto& [type, model] : kNames) {
    const MigGpuModel* m = FindMigGpuModel(type);
    ASSERT_NE(m, nullptr) << type;
    EXPECT_EQ(m->model, model) << type;
  }
  EXPECT_EQ(FindMigGpuModel("NVIDIA-Tesla T4"), nullptr);
  EXPECT_EQ(FindMigGpuModel("NVIDIA H100 NVL"), nullptr);  // 94 GB: other profiles
}

TEST(MigGeometryTest, ProfilesOfAModelAsAPluginRegistersThem) {
  const MigGpuModel* a100 = FindMigGpuModel("NVIDIA A100-SXM4-40GB");
  ASSERT_NE(a100, nullptr);
  // HAMi's chart-default allowlist for A100-40GB.
  const std::string_view kAllow[] = {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb", "9g.1gb"};
  std::vector<MigProfile> p = MigProfilesOf(*a100, kAllow);
  ASSERT_EQ(p.size(), 4U);
  EXPECT_EQ(p[0].name, "1g.5gb");
  EXPECT_EQ(p[0].memory_mb, 5120);
  EXPECT_EQ(p[0].core, 15);
  EXPECT_EQ(p[1].core, 29);
  EXPECT_EQ(p[2].core, 43);
  EXPECT_EQ(p[2].placements, (std::vector<MigPlacement>{{0, 4}, {4, 4}}));
  EXPECT_EQ(p[3].core, 100);
  EXPECT_EQ(p[3].placements, (std::vector<MigPlacement>{{0, 8}}));
  EXPECT_EQ(MigProfilesOf(*a100).size(), 7U);
}

}  // namespace
}  // namespace tessera::device
