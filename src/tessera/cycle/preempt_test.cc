#include "tessera/cycle/preempt.h"

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/accounting/quota_book.h"
#include "tessera/testing/objects.h"

namespace tessera::cycle {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// The uids of the victims, in order.
std::vector<std::string> Uids(const NodeVictims& v) {
  std::vector<std::string> out;
  for (const PotentialVictim& p : v.victims) {
    out.push_back(p.uid);
  }
  return out;
}

// Nodes n1 (two 8000 MiB cards GPU-1a, GPU-1b) and n2 (one, GPU-2); pods are added per test.
class PreemptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1a", "GPU-1b"}, 8000)).ok());
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n2", {"GPU-2"}, 8000)).ok());
  }

  // Pod `ns`/`name` (uid = name) bound to `node`, holding `mem` MiB of each of `uuids` (one
  // container), of priority `priority`, started at `start`; a potential victim.
  void Running(const std::string& name, const std::string& node,
               const std::vector<std::string>& uuids, int32_t mem, int32_t priority, int64_t start,
               const std::string& ns = "ml") {
    ledger::PodAllocation a;
    a.uid = name;
    a.ns = ns;
    a.name = name;
    a.node = node;
    a.bound_node = node;
    a.devices.emplace_back();
    for (const std::string& uuid : uuids) {
      a.devices[0].push_back({uuid, "NVIDIA", mem, 0});
    }
    ASSERT_TRUE(ledger_.Apply(a).ok());
    potential_[name] = {
        .uid = name, .ns = ns, .name = name, .priority = priority, .start_unix = start};
  }

  // The victims on `node` for pod ml/high (priority `priority`) asking `count` GPUs of `mem`
  // MiB in each of its containers (one per element of `mems`).
  std::optional<NodeVictims> For(const std::string& node, const std::vector<std::string>& mems,
                                 const std::string& count = "1", int32_t priority = 100,
                                 const Config& config = {},
                                 const absl::flat_hash_set<std::string>& evicted = {}) {
    pod_ = kube::Pod();
    pod_.meta.ns = "ml";
    pod_.meta.name = "high";
    pod_.meta.uid = "uid-high";
    pod_.priority = priority;
    for (size_t i = 0; i < mems.size(); ++i) {
      pod_.containers.push_back(
          ::tessera::testing::GpuContainer("c" + std::to_string(i), count, mems[i], ""));
    }
    decoded_ = Decode(*vendor_, pod_, DecodeMode::kFilter);
    EXPECT_EQ(decoded_.code, DecodeCode::kRequest);
    const Input in{.pod = &pod_,
                   .request = &decoded_.request,
                   .constraints = &decoded_.constraints,
                   .ledger = &ledger_};
    return VictimsOn(config, in, HoldersByNode::Of(ledger_), node, potential_, evicted);
  }

  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger_;
  PotentialVictims potential_;
  kube::Pod pod_;
  Decoded decoded_;
};

TEST_F(PreemptTest, OneVictimFreesTheShareAndTheOlderPodStays) {
  // The case: one 8000 MiB card, two low pods of 4000, a high pod of 4000.
  Running("old", "n2", {"GPU-2"}, 4000, 0, 1000);
  Running("young", "n2", {"GPU-2"}, 4000, 0, 2000);
  std::optional<NodeVictims> v = For("n2", {"4000"});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), ElementsAre("young"));  // the least work lost
  EXPECT_EQ(v->pdb_violations, 0);
  ASSERT_TRUE(v->decision.winner.has_value());
  ASSERT_EQ(v->decision.devices.size(), 1u);
  EXPECT_EQ(v->decision.devices[0].at(0).uuid, "GPU-2");
}

TEST_F(PreemptTest, OnlyLowerPrioritiesAreVictims) {
  Running("same", "n2", {"GPU-2"}, 8000, 100, 1000);
  EXPECT_FALSE(For("n2", {"4000"}).has_value());
  Running("higher", "n1", {"GPU-1a", "GPU-1b"}, 8000, 200, 1000);
  EXPECT_FALSE(For("n1", {"1000"}).has_value());
}

TEST_F(PreemptTest, ALowerPriorityIsEvictedBeforeAHigherOne) {
  Running("p5", "n2", {"GPU-2"}, 4000, 5, 1000);
  Running("p1", "n2", {"GPU-2"}, 4000, 1, 3000);
  Running("p3", "n2", {"GPU-2"}, 0, 3, 500);  // holds a slot only
  std::optional<NodeVictims> v = For("n2", {"4000"});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), ElementsAre("p1"));
}

TEST_F(PreemptTest, NeverAVictimThatDoesNotHelp) {
  // 7500 MiB fit only on an emptied GPU-1a; the pod on GPU-1b is of the lowest priority but
  // its removal would not help, so it stays.
  Running("big", "n1", {"GPU-1a"}, 6000, 5, 1000);
  Running("small", "n1", {"GPU-1b"}, 1000, 1, 2000);
  std::optional<NodeVictims> v = For("n1", {"7500"});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), ElementsAre("small"));
  // The lowest priority is tried last: once "small" is gone GPU-1b has 8000 free.
  Running("small2", "n1", {"GPU-1b"}, 1000, 9, 2000);
  v = For("n1", {"7500"});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->victims.size(), 1u);
}

TEST_F(PreemptTest, APodWhoseEvictionViolatesABudgetIsSparedFirst) {
  Running("guarded", "n2", {"GPU-2"}, 4000, 0, 2000);
  Running("free", "n2", {"GPU-2"}, 4000, 0, 1000);
  potential_["guarded"].violates_pdb = true;
  std::optional<NodeVictims> v = For("n2", {"4000"});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), ElementsAre("free"));
  EXPECT_EQ(v->pdb_violations, 0);

  // When only the guarded pod frees enough, it is a victim and counted.
  std::optional<NodeVictims> both = For("n2", {"8000"});
  ASSERT_TRUE(both.has_value());
  EXPECT_THAT(Uids(*both), ElementsAre("guarded", "free"));
  EXPECT_EQ(both->pdb_violations, 1);
}

TEST_F(PreemptTest, AMultiGpuPodNeedsEveryCardItTakes) {
  Running("a", "n1", {"GPU-1a"}, 6000, 0, 1000);
  Running("b", "n1", {"GPU-1b"}, 6000, 0, 2000);
  std::optional<NodeVictims> one = For("n1", {"4000"}, "1");
  ASSERT_TRUE(one.has_value());
  EXPECT_THAT(Uids(*one), ElementsAre("b"));
  std::optional<NodeVictims> two = For("n1", {"4000"}, "2");
  ASSERT_TRUE(two.has_value());
  EXPECT_THAT(Uids(*two), ::testing::UnorderedElementsAre("a", "b"));
  ASSERT_EQ(two->decision.devices.at(0).size(), 2u);
}

TEST_F(PreemptTest, EveryContainerOfThePodMustFit) {
  Running("a", "n1", {"GPU-1a"}, 5000, 0, 1000);
  Running("b", "n1", {"GPU-1b"}, 5000, 0, 2000);
  // One container of 3000 fits beside either pod; two of 5000 (one card each) need both gone.
  std::optional<NodeVictims> small = For("n1", {"3000"});
  ASSERT_TRUE(small.has_value());
  EXPECT_THAT(Uids(*small), IsEmpty());
  std::optional<NodeVictims> two = For("n1", {"5000", "5000"});
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->victims.size(), 2u);
  EXPECT_EQ(two->decision.devices.size(), 2u);
}

TEST_F(PreemptTest, ThePodsKubeSchedulerEvictsCountAsGoneAndAreNotReturned) {
  Running("old", "n2", {"GPU-2"}, 4000, 0, 1000);
  Running("young", "n2", {"GPU-2"}, 4000, 0, 2000);
  std::optional<NodeVictims> v = For("n2", {"4000"}, "1", 100, {}, {"old", "cpu-only"});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), IsEmpty());
  EXPECT_TRUE(v->decision.winner.has_value());
}

TEST_F(PreemptTest, OnAMigCardTheVictimIsTheInstanceThatFreesAPlacement) {
  // One A100 in mig mode split into two 3g.20gb instances (placements {0,4} and {4,4}) held by
  // two low pods: a 1g.5gb ask needs exactly one of them gone, the younger.
  ASSERT_TRUE(ledger_.SetNode(::tessera::testing::MigNodeDevices("m1", {"GPU-m0"})).ok());
  for (const auto& [name, start, placement] :
       {std::tuple{"mig-old", 1000, device::MigPlacement{0, 4}},
        std::tuple{"mig-young", 2000, device::MigPlacement{4, 4}}}) {
    ledger::PodAllocation a;
    a.uid = name;
    a.ns = "ml";
    a.name = name;
    a.node = "m1";
    a.bound_node = "m1";
    a.devices = {{{"GPU-m0", "NVIDIA", 19968, 43}}};
    device::MigAllocation m;
    m.gpu_uuid = "GPU-m0";
    m.profile = "3g.20gb";
    m.placement = placement;
    a.mig = {m};
    ASSERT_TRUE(ledger_.Apply(a).ok());
    potential_[name] = {.uid = name, .ns = "ml", .name = name, .priority = 0, .start_unix = start};
  }
  std::optional<NodeVictims> v = For("m1", {"4000"});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), ElementsAre("mig-young"));
  ASSERT_EQ(v->decision.mig.size(), 1u);
  ASSERT_TRUE(v->decision.mig[0][0].has_value());
  EXPECT_EQ(v->decision.mig[0][0]->profile, "1g.5gb");
  EXPECT_GE(v->decision.mig[0][0]->placement.start, 4u) << "inside the freed half";
}

TEST_F(PreemptTest, UnboundPodsAndReservationsAreNeverVictims) {
  // An allocation whose bind has not been observed, and another pod's in-flight reservation.
  ledger::PodAllocation unbound;
  unbound.uid = "unbound";
  unbound.ns = "ml";
  unbound.name = "unbound";
  unbound.node = "n2";
  unbound.devices = {{{"GPU-2", "NVIDIA", 4000, 0}}};
  ASSERT_TRUE(ledger_.Apply(unbound).ok());
  potential_["unbound"] = {.uid = "unbound", .ns = "ml", .name = "unbound"};
  ASSERT_TRUE(ledger_
                  .Reserve("r", "ml", "r", "n2", {{{"GPU-2", "NVIDIA", 4000, 0}}},
                           absl::FromUnixSeconds(2000000000))
                  .ok());
  potential_["r"] = {.uid = "r", .ns = "ml", .name = "r"};
  // The unbound allocation holds nothing (holder rule 2); the reservation holds 4000 MiB and
  // cannot be evicted, so 8000 MiB fit nowhere while 4000 need nobody gone.
  EXPECT_FALSE(For("n2", {"8000"}).has_value());
  std::optional<NodeVictims> v = For("n2", {"4000"});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), IsEmpty());
}

TEST_F(PreemptTest, ThePreemptorsOwnReservationDoesNotCountAgainstIt) {
  Running("low", "n2", {"GPU-2"}, 4000, 0, 1000);
  ASSERT_TRUE(ledger_
                  .Reserve("uid-high", "ml", "high", "n2", {{{"GPU-2", "NVIDIA", 4000, 0}}},
                           absl::FromUnixSeconds(2000000000))
                  .ok());
  std::optional<NodeVictims> v = For("n2", {"4000"});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), IsEmpty());
}

TEST_F(PreemptTest, TheNamespaceQuotaCountsTheVictimsOfItsNamespaceOnly) {
  // ml may use 12000 MiB: 4000 on n2 elsewhere, 4000 here on n1 by "mine"; "theirs" (another
  // namespace, lower priority still) holds GPU-1b. The 6000 MiB pod fits GPU-1a's devices but
  // not the quota until "mine" goes; evicting "theirs" would not help.
  accounting::QuotaBook quotas({});
  quotas.Upsert(::tessera::testing::GpuMemQuota("ml", "gpu", "12000"));
  Running("elsewhere", "n2", {"GPU-2"}, 4000, 1000, 1000);
  Running("mine", "n1", {"GPU-1a"}, 4000, 5, 1000);
  Running("theirs", "n1", {"GPU-1b"}, 4000, 0, 1000, "other");
  std::optional<NodeVictims> v = For("n1", {"6000"}, "1", 100, {.quotas = &quotas});
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(Uids(*v), ElementsAre("mine"));
  // Without the quota the same pod needs nobody evicted.
  std::optional<NodeVictims> free = For("n1", {"3000"});
  ASSERT_TRUE(free.has_value());
  EXPECT_THAT(Uids(*free), IsEmpty());
}

TEST_F(PreemptTest, AnUnknownNodeOrAPodThatCannotFitHasNoVictims) {
  EXPECT_FALSE(For("ghost", {"1000"}).has_value());
  Running("low", "n2", {"GPU-2"}, 4000, 0, 1000);
  EXPECT_FALSE(For("n2", {"9000"}).has_value());  // bigger than the card
}

TEST_F(PreemptTest, TheLedgerIsNotChanged) {
  Running("old", "n2", {"GPU-2"}, 4000, 0, 1000);
  Running("young", "n2", {"GPU-2"}, 4000, 0, 2000);
  const std::vector<ledger::PodAllocation> before = ledger_.Records();
  ASSERT_TRUE(For("n2", {"8000"}).has_value());
  EXPECT_EQ(ledger_.Records(), before);
  EXPECT_EQ(ledger_.View("n2")->usage.at(0).usedmem, 8000);
}

}  // namespace
}  // namespace tessera::cycle
