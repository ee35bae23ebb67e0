// Tests of placement-aware MIG fit: HAMi v2.10.0's vectors (pkg/device/nvidia/
// mig_topology_test.go, mig_capability_test.go and the worked A100-40GB example), each profile
// of each geometry of the four models (mig_geometry.h), and a random-churn property.
#include "tessera/schedule/mig_fit.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

#include "tessera/device/mig_geometry.h"

namespace tessera::schedule {
namespace {

using device::MigPlacement;
using device::MigProfile;

// v2.10.0 mig_capability_test.go:a100MigProfiles.
std::vector<MigProfile> A100() {
  const device::MigGpuModel* m = device::FindMigGpuModel("NVIDIA A100-SXM4-40GB");
  const std::string_view names[] = {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"};
  return device::MigProfilesOf(*m, names);
}

std::string Name(std::span<const MigProfile> profiles, const std::optional<MigChoice>& c) {
  return c.has_value() ? profiles[c->profile].name + "@" + std::to_string(c->placement.start)
                       : "none";
}

// v2.10.0 TestSelectMigPlacementUsesBalancedPacking: 3g high, 2g low, 1g high.
TEST(MigFitHamiTest, BalancedPackingOrder) {
  const std::vector<MigProfile> p = A100();
  std::vector<MigPlacement> occupied;
  const std::pair<int32_t, const char*> kSteps[] = {
      {20000, "3g.20gb@4"}, {10000, "2g.10gb@0"}, {5000, "1g.5gb@3"}, {5000, "1g.5gb@2"}};
  for (const auto& [mem, want] : kSteps) {
    std::optional<MigChoice> c = SelectMigCandidateHami(p, occupied, mem);
    ASSERT_EQ(Name(p, c), want);
    occupied.push_back(c->placement);
  }
}

// Worked example (reference §2.4): 1g@6, 1g@5, 2g@0, then 15000 MiB fits nowhere. Usage is
// NVML's memory (4864 for 1g), so a 4000 MiB request takes the 1g profile.
TEST(MigFitHamiTest, WorkedExample) {
  std::vector<MigProfile> p = A100();
  p[0].memory_mb = 4864;
  p[1].memory_mb = 9856;
  p[2].memory_mb = 19968;
  p[3].memory_mb = 40192;
  std::vector<MigPlacement> occupied;
  for (const auto& [mem, want] : std::vector<std::pair<int32_t, std::string>>{
           {4000, "1g.5gb@6"}, {4000, "1g.5gb@5"}, {8000, "2g.10gb@0"}, {15000, "none"}}) {
    std::optional<MigChoice> c = SelectMigCandidateHami(p, occupied, mem);
    ASSERT_EQ(Name(p, c), want) << mem;
    if (c.has_value()) {
      occupied.push_back(c->placement);
    }
  }
  // Explain: 3g's placement 0 is blocked by the 2g alone, placement 4 by both 1g.
  EXPECT_EQ(ExplainMigNoFit(p, occupied, 15000),
            "3g.20gb (19968 MiB): no free placement; slices 0-3 would be free without the "
            "instance at slices 0-1");
  // A whole-card request (devmem 40960) exceeds 7g.40gb's 40192 MiB: never fits.
  EXPECT_FALSE(SelectMigCandidateHami(p, {}, 40960).has_value());
  EXPECT_EQ(ExplainMigNoFit(p, {}, 40960),
            "no profile has at least 40960 MiB (largest: 7g.40gb, 40192 MiB)");
  const std::vector<MigPlacement> halves = {{0, 4}, {4, 4}};
  EXPECT_EQ(ExplainMigNoFit(p, halves, 30000),
            "7g.40gb (40192 MiB): no free placement; slices 0-7 would be free without the "
            "instances at slices 0-3, slices 4-7");
  EXPECT_EQ(ExplainMigNoFit({}, {}, 1), "the card registers no MIG profile");
}

// v2.10.0 TestCustomFilterUsesReportedPlacementCapacity: three 2g instances leave slice 6, which
// only 1g can use; a larger request falls through to the next profile with a free placement.
TEST(MigFitHamiTest, ReportedPlacementCapacity) {
  const std::vector<MigProfile> p = A100();
  const std::vector<MigPlacement> occupied = {{0, 2}, {2, 2}, {4, 2}};
  EXPECT_EQ(Name(p, SelectMigCandidateHami(p, occupied, 10240)), "none");
  EXPECT_EQ(Name(p, SelectMigCandidateHami(p, occupied, 1)), "1g.5gb@6");
  // Not a sum of free slices: two 3g free halves? no — slices 6 and 7 are free, yet no 2g fits.
  EXPECT_FALSE(MigPlaceable(p[1], occupied));
}

// Each profile of each model's geometry: an empty card takes exactly max_instances instances of
// it, with HAMi's rule and with Tessera's, without overlap; the next one fails.
TEST(MigFitGeometryTest, EveryProfileOfEveryModelFillsToItsInstanceCount) {
  for (const device::MigGpuModel& model : device::MigGpuModels()) {
    for (const device::MigGeometryProfile& g : model.profiles) {
      if (std::string_view(g.name).ends_with("+me")) {
        continue;  // same placements as the plain 1g; its single instance is a driver limit
      }
      SCOPED_TRACE(std::string(model.model) + " " + std::string(g.name));
      const std::string_view only[] = {g.name};
      const std::vector<MigProfile> profiles = device::MigProfilesOf(model, only);
      ASSERT_EQ(profiles.size(), 1U);
      for (bool hami : {true, false}) {
        std::vector<MigPlacement> occupied;
        for (uint32_t i = 0; i < g.max_instances; ++i) {
          std::optional<MigPlacement> got;
          if (hami) {
            std::optional<MigChoice> c = SelectMigCandidateHami(profiles, occupied, 1);
            ASSERT_TRUE(c.has_value()) << "instance " << i;
            got = c->placement;
          } else {
            const MigCard card{profiles, occupied};
            std::optional<MigCardChoice> c = ChooseMigPlacement({&card, 1}, 1);
            ASSERT_TRUE(c.has_value()) << "instance " << i;
            got = c->choice.placement;
          }
          for (const MigPlacement& o : occupied) {
            ASSERT_FALSE(got->Overlaps(o));
          }
          occupied.push_back(*got);
        }
        EXPECT_FALSE(SelectMigCandidateHami(profiles, occupied, 1).has_value());
        const MigCard card{profiles, occupied};
        EXPECT_FALSE(ChooseMigPlacement({&card, 1}, 1).has_value());
      }
    }
  }
}

// Full geometries of the MIG user guide fit exactly on each model, asked largest first:
// 3g+3g, 3g+2g+1g+1g, 2g+2g+2g+1g, 7×1g, 7g. (4g is left out: its memory equals 3g's, so a
// request by memory gets 3g whenever 4g could be placed; HeadroomOf still counts it.)
TEST(MigFitGeometryTest, MixedGeometriesFitOnEachModel) {
  const std::vector<std::vector<uint32_t>> kGeometries = {
      {3, 3}, {3, 2, 1, 1}, {2, 2, 2, 1}, {1, 1, 1, 1, 1, 1, 1}, {7}};
  for (const device::MigGpuModel& model : device::MigGpuModels()) {
    // The plugin's usual allowlist: the 1-memory-slice 1g and 2g, 3g, 4g, 7g.
    std::vector<MigProfile> all = device::MigProfilesOf(model);
    std::vector<MigProfile> p;
    for (size_t i : {0U, 3U, 4U, 5U, 6U}) {
      p.push_back(all[i]);
    }
    for (const auto& geometry : kGeometries) {
      SCOPED_TRACE(std::string(model.model) + " geometry of " + std::to_string(geometry.size()));
      std::vector<MigPlacement> occupied;
      for (uint32_t slices : geometry) {
        // Ask the memory of the profile with `slices` compute slices.
        int32_t mem = 0;
        for (const MigProfile& q : p) {
          if (q.slice_count == slices) {
            mem = q.memory_mb;
          }
        }
        const MigCard card{p, occupied};
        std::optional<MigCardChoice> c = ChooseMigPlacement({&card, 1}, mem);
        ASSERT_TRUE(c.has_value()) << slices << "g";
        EXPECT_EQ(p[c->choice.profile].slice_count, slices);
        occupied.push_back(c->choice.placement);
      }
    }
  }
}

// Where Tessera and HAMi differ: HAMi puts a 2g at 0, which makes 4g impossible; Tessera puts it
// at 4 and keeps 4g placeable. The profile is the same.
TEST(MigFitTesseraTest, KeepsTheLargestProfilePlaceable) {
  std::vector<MigProfile> p = device::MigProfilesOf(*device::FindMigGpuModel("A100-SXM4-40GB"));
  p.erase(p.begin() + 1);  // drop 1g.5gb+me
  const MigCard card{p, {}};
  std::optional<MigCardChoice> tessera = ChooseMigPlacement({&card, 1}, 10240);
  std::optional<MigChoice> hami = SelectMigCandidateHami(p, {}, 10240);
  ASSERT_TRUE(tessera.has_value() && hami.has_value());
  EXPECT_EQ(Name(p, hami), "1g.10gb@6");  // 1g.10gb (2 memory slices) ties 2g.10gb, fewer SMs
  EXPECT_EQ(tessera->choice.profile, hami->profile);
  // Without 1g.10gb: HAMi 2g@0 (4g no longer placeable), Tessera 2g@4 (4g@0 still is).
  std::vector<MigProfile> q = p;
  q.erase(q.begin() + 1);  // drop 1g.10gb
  const MigCard qcard{q, {}};
  EXPECT_EQ(Name(q, SelectMigCandidateHami(q, {}, 10000)), "2g.10gb@0");
  std::optional<MigCardChoice> t = ChooseMigPlacement({&qcard, 1}, 10000);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(Name(q, t->choice), "2g.10gb@4");
  std::vector<MigPlacement> after = {t->choice.placement};
  EXPECT_EQ(HeadroomOf(q, after), (MigHeadroom{4, 4}));
  std::vector<MigPlacement> hami_after = {{0, 2}};
  EXPECT_EQ(HeadroomOf(q, hami_after), (MigHeadroom{4, 3}));
}

// Across cards: a 1g goes to the card already in use, not to the empty one (which keeps 7g).
TEST(MigFitTesseraTest, FillsAUsedCardBeforeBreakingAWholeOne) {
  const std::vector<MigProfile> p = A100();
  const std::vector<MigPlacement> none;
  const std::vector<MigPlacement> one = {{6, 1}};
  const MigCard cards[] = {{p, none}, {p, one}};
  std::optional<MigCardChoice> c = ChooseMigPlacement(cards, 1000);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->card, 1U);
  EXPECT_EQ(c->choice.placement, (MigPlacement{5, 1}));
}

// Property: random churn of allocations and frees on three cards of each model never yields two
// overlapping instances, never a placement that is not the profile's, and a request is refused
// only when no adequate profile has a free placement on any card.
TEST(MigFitPropertyTest, RandomChurnNeverOverlaps) {
  std::mt19937 rng(2606);
  for (const device::MigGpuModel& model : device::MigGpuModels()) {
    SCOPED_TRACE(std::string(model.model));
    const std::vector<MigProfile> p = device::MigProfilesOf(model);
    std::vector<std::vector<MigPlacement>> occupied(3);
    int placed = 0;
    for (int step = 0; step < 3000; ++step) {
      if (rng() % 3 == 0) {
        auto& card = occupied[rng() % occupied.size()];
        if (!card.empty()) {
          card.erase(card.begin() + static_cast<long>(rng() % card.size()));
        }
        continue;
      }
      const int32_t mem = static_cast<int32_t>(rng() % static_cast<uint32_t>(model.memory_mib));
      std::vector<MigCard> cards;
      for (const auto& o : occupied) {
        cards.push_back(MigCard{p, o});
      }
      std::optional<MigCardChoice> c = ChooseMigPlacement(cards, mem);
      bool any = false;
      for (const auto& o : occupied) {
        for (const MigProfile& q : p) {
          any = any || (q.memory_mb >= mem && MigPlaceable(q, o));
        }
      }
      ASSERT_EQ(c.has_value(), any) << "step " << step;
      if (!c.has_value()) {
        continue;
      }
      const MigProfile& chosen = p[c->choice.profile];
      ASSERT_GE(chosen.memory_mb, mem);
      ASSERT_NE(std::find(chosen.placements.begin(), chosen.placements.end(), c->choice.placement),
                chosen.placements.end());
      for (const MigPlacement& o : occupied[c->card]) {
        ASSERT_FALSE(o.Overlaps(c->choice.placement)) << "step " << step;
      }
      occupied[c->card].push_back(c->choice.placement);
      ++placed;
    }
    EXPECT_GT(placed, 500);
  }
}

}  // namespace
}  // namespace tessera::schedule
