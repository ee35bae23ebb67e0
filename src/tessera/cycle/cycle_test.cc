#include "tessera/cycle/cycle.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/annotations.h"
#include "tessera/testing/objects.h"

namespace tessera::cycle {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::unique_ptr<device::Vendor> Nvidia() {
  return device::NewNvidiaVendor(device::DefaultNvidiaConfig());
}

// Pod ml/<name> (uid "uid-<name>") with one container asking `count` GPUs of `mem` MiB ("" for
// no GPU at all).
kube::Pod GpuPod(const std::string& name, const std::string& count, const std::string& mem) {
  kube::Pod pod;
  pod.meta.ns = "ml";
  pod.meta.name = name;
  pod.meta.uid = "uid-" + name;
  pod.containers.push_back(::tessera::testing::GpuContainer("main", count, mem, ""));
  return pod;
}

std::vector<schedule::Candidate> Candidates(const std::vector<std::string>& names) {
  std::vector<schedule::Candidate> out(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    out[i].name = names[i];
  }
  return out;
}

kube::ResourceQuota GpumemQuota(const std::string& limit) {
  return ::tessera::testing::GpuMemQuota("ml", "gpu", limit);
}

// Two registered nodes of one 16384 MiB card each (n1: GPU-1, n2: GPU-2); ml/holder uses 12000
// MiB of GPU-1 (a record bound to n1).
class CycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n1", {"GPU-1"})).ok());
    ASSERT_TRUE(ledger_.SetNode(::tessera::testing::GpuNodeDevices("n2", {"GPU-2"})).ok());
    holder_.uid = "uid-holder";
    holder_.ns = "ml";
    holder_.name = "holder";
    holder_.node = "n1";
    holder_.bound_node = "n1";
    holder_.devices = {{{"GPU-1", "NVIDIA", 12000, 0}}};
    ASSERT_TRUE(ledger_.Apply(holder_).ok());
  }

  // Decodes `pod` (which must ask for devices) and runs the cycle over `names`.
  Result RunOn(const kube::Pod& pod, const std::vector<std::string>& names,
               const ledger::Ledger& view, const Config& config = {},
               ledger::Ledger* reserve_in = nullptr) {
    decoded_ = Decode(*vendor_, pod, DecodeMode::kFilter);
    EXPECT_EQ(decoded_.code, DecodeCode::kRequest);
    candidates_ = Candidates(names);
    return cycle::Run(config,
                      {.pod = &pod,
                       .request = &decoded_.request,
                       .constraints = &decoded_.constraints,
                       .ledger = &view,
                       .reserve_in = reserve_in,
                       .expiry = absl::FromUnixSeconds(2000000000)},
                      &candidates_);
  }

  std::unique_ptr<device::Vendor> vendor_ = Nvidia();
  ledger::Ledger ledger_;
  ledger::PodAllocation holder_;
  Decoded decoded_;
  std::vector<schedule::Candidate> candidates_;
};

TEST(CycleDecodeTest, RequestPassThroughAndErrors) {
  const std::unique_ptr<device::Vendor> vendor = Nvidia();
  const Decoded asks = Decode(*vendor, GpuPod("a", "1", "8000"), DecodeMode::kFilter);
  ASSERT_EQ(asks.code, DecodeCode::kRequest);
  ASSERT_EQ(asks.request.containers.size(), 1u);
  ASSERT_TRUE(asks.request.containers[0].has_value());
  EXPECT_EQ(asks.request.containers[0]->memreq, 8000);

  EXPECT_EQ(Decode(*vendor, GpuPod("b", "", ""), DecodeMode::kFilter).code,
            DecodeCode::kPassThrough);
  EXPECT_EQ(Decode(*vendor, GpuPod("b", "", ""), DecodeMode::kStrict).code,
            DecodeCode::kPassThrough);

  const Decoded bad_request = Decode(*vendor, GpuPod("c", "x", ""), DecodeMode::kFilter);
  EXPECT_EQ(bad_request.code, DecodeCode::kError);
  EXPECT_FALSE(bad_request.error.ok());
}

TEST(CycleDecodeTest, ConstraintsAreReadAfterThePassThroughUnlessStrict) {
  const std::unique_ptr<device::Vendor> vendor = Nvidia();
  kube::Pod none = GpuPod("a", "", "");
  none.meta.annotations.Set(std::string(device::kNodeSchedulerPolicyAnnotation), "sideways");
  // HAMi's filter passes a pod that asks for nothing before reading its annotations.
  EXPECT_EQ(Decode(*vendor, none, DecodeMode::kFilter).code, DecodeCode::kPassThrough);
  const Decoded strict = Decode(*vendor, none, DecodeMode::kStrict);
  EXPECT_EQ(strict.code, DecodeCode::kError);
  EXPECT_THAT(std::string(strict.error.message()),
              ::testing::HasSubstr(device::kNodeSchedulerPolicyAnnotation));

  kube::Pod gpu = GpuPod("b", "1", "1000");
  gpu.meta.annotations.Set(std::string(device::kNodeSchedulerPolicyAnnotation), "sideways");
  EXPECT_EQ(Decode(*vendor, gpu, DecodeMode::kFilter).code, DecodeCode::kError);

  gpu.meta.annotations.Set(std::string(device::kNodeSchedulerPolicyAnnotation), "spread");
  const Decoded spread = Decode(*vendor, gpu, DecodeMode::kFilter);
  ASSERT_EQ(spread.code, DecodeCode::kRequest);
  EXPECT_EQ(spread.constraints.node_policy, device::NodePolicy::kSpread);
}

TEST_F(CycleTest, FitsScoresAndPicks) {
  // 8000 MiB: only n2's card has room. Binpack would prefer the fuller n1 if it fit.
  const Result r = RunOn(GpuPod("p", "1", "8000"), {"n1", "n2", "ghost"}, ledger_);
  ASSERT_TRUE(r.decision.winner.has_value());
  EXPECT_EQ(candidates_[*r.decision.winner].name, "n2");
  ASSERT_EQ(r.decision.devices.size(), 1u);
  ASSERT_EQ(r.decision.devices[0].size(), 1u);
  EXPECT_EQ(r.decision.devices[0][0].uuid, "GPU-2");
  // The snapshot stage filled what the ledger knows; "ghost" stays unregistered.
  EXPECT_TRUE(candidates_[0].snapshot.has_value());
  EXPECT_FALSE(candidates_[2].snapshot.has_value());
  EXPECT_FALSE(r.decision.nodes[0].fit);
  EXPECT_GT(r.decision.nodes[0].score, 0);  // scored with the holder's usage
  EXPECT_EQ(r.decision.nodes[2].reason, schedule::kNodeUnregistered);
  EXPECT_FALSE(r.quota.Limited());
  EXPECT_TRUE(r.reserved.ok());
  // A node was picked: nothing to diagnose.
  EXPECT_THAT(r.diagnosis.failed, IsEmpty());
  EXPECT_TRUE(r.diagnosis.quota.empty());
  EXPECT_FALSE(ledger_.HasReservation("uid-p"));  // no reserve_in: nothing reserved
}

TEST_F(CycleTest, ReserveHoldsTheWinnersDevices) {
  const Result r = RunOn(GpuPod("p", "1", "9000"), {"n1", "n2"}, ledger_, {}, &ledger_);
  ASSERT_TRUE(r.reserved.ok()) << r.reserved;
  ASSERT_TRUE(ledger_.HasReservation("uid-p"));
  EXPECT_EQ(ledger_.ReservationExpiry("uid-p"), absl::FromUnixSeconds(2000000000));
  std::optional<ledger::NodeView> n2 = ledger_.View("n2");
  ASSERT_TRUE(n2.has_value());
  EXPECT_EQ(n2->usage[0].usedmem, 9000);
  // Reserved in the view: the next pod of the same size no longer fits anywhere.
  const Result next = RunOn(GpuPod("q", "1", "9000"), {"n1", "n2"}, ledger_, {}, &ledger_);
  EXPECT_FALSE(next.decision.winner.has_value());
  EXPECT_FALSE(ledger_.HasReservation("uid-q"));
}

TEST_F(CycleTest, DiagnosisTypesEveryFailedNodeOnce) {
  const Result r = RunOn(GpuPod("p", "1", "17000"), {"n1", "ghost", "n1", "n2"}, ledger_);
  ASSERT_FALSE(r.decision.winner.has_value());
  ASSERT_EQ(r.diagnosis.failed.size(), 3u);  // n1 once, however often it is named
  EXPECT_THAT(r.diagnosis.at, ElementsAre(0u, 1u, 3u));
  EXPECT_EQ(r.diagnosis.failed[0].node, "n1");
  EXPECT_EQ(r.diagnosis.failed[0].failure, NodeFailure::kDevices);
  EXPECT_THAT(r.diagnosis.failed[0].parts.Strings(), ElementsAre("1/1 CardInsufficientMemory"));
  EXPECT_EQ(r.diagnosis.failed[1].node, "ghost");
  EXPECT_EQ(r.diagnosis.failed[1].failure, NodeFailure::kUnregistered);
  EXPECT_EQ(NodeFailureLabel(r.diagnosis.failed[1].failure), "node unregistered");
  EXPECT_THAT(r.diagnosis.failed[1].parts, IsEmpty());
  EXPECT_EQ(r.diagnosis.failed[2].node, "n2");
  EXPECT_TRUE(r.diagnosis.quota.empty());
}

TEST_F(CycleTest, DiagnoseCanWaitForTheCaller) {
  decoded_ = Decode(*vendor_, GpuPod("p", "1", "17000"), DecodeMode::kFilter);
  candidates_ = Candidates({"n1", "n2"});
  const kube::Pod pod = GpuPod("p", "1", "17000");
  const Result r = cycle::Run({},
                              {.pod = &pod,
                               .request = &decoded_.request,
                               .constraints = &decoded_.constraints,
                               .ledger = &ledger_,
                               .diagnose = false},
                              &candidates_);
  ASSERT_FALSE(r.decision.winner.has_value());
  EXPECT_THAT(r.diagnosis.failed, IsEmpty());
  const Diagnosis later = Diagnose(candidates_, r.decision, r.quota);
  EXPECT_EQ(later.failed.size(), 2u);
}

TEST_F(CycleTest, TheNamespaceQuotaRefuses) {
  accounting::QuotaBook quotas({});
  quotas.Upsert(GpumemQuota("18000"));
  // Unlimited, the pod fits on n2; the pre-check bounds it by what ml holds already (12000).
  EXPECT_TRUE(RunOn(GpuPod("p", "1", "8000"), {"n1", "n2"}, ledger_).decision.winner);
  const Result r =
      RunOn(GpuPod("p", "1", "8000"), {"n1", "n2"}, ledger_, {.quotas = &quotas}, &ledger_);
  EXPECT_TRUE(r.quota.Limited());
  EXPECT_EQ(r.quota.usedmem, 12000);
  ASSERT_FALSE(r.decision.winner.has_value());
  EXPECT_EQ(r.diagnosis.quota,
            "namespace ml: limits.nvidia.com/gpumem 18000, used 12000 + 8000 asked");
  ASSERT_EQ(r.diagnosis.failed.size(), 2u);
  EXPECT_THAT(r.diagnosis.failed[1].parts.Strings(), ElementsAre("1/1 ResourceQuotaNotFit"));
  EXPECT_FALSE(ledger_.HasReservation("uid-p"));
  // Another namespace is not limited.
  kube::Pod other = GpuPod("p", "1", "8000");
  other.meta.ns = "web";
  EXPECT_TRUE(RunOn(other, {"n1", "n2"}, ledger_, {.quotas = &quotas}).decision.winner);
}

TEST_F(CycleTest, AWhatIfViewDecidesOnTheCopy) {
  // The live ledger: the holder leaves n1 no room for 16000 MiB, n2's card takes it.
  ASSERT_TRUE(ledger_
                  .Reserve("uid-other", "ml", "other", "n2", {{{"GPU-2", "NVIDIA", 1000, 0}}},
                           absl::InfiniteFuture())
                  .ok());
  EXPECT_FALSE(RunOn(GpuPod("p", "1", "16000"), {"n1", "n2"}, ledger_).decision.winner);
  // A copy without the holder (a why replay's --if-deleted): n1 fits; the live ledger is unread.
  std::vector<std::shared_ptr<const device::NodeDevices>> nodes;
  for (const ledger::NodeView& n : ledger_.Full().nodes) {
    nodes.push_back(n.devices);
  }
  std::unique_ptr<ledger::Ledger> copy =
      ledger::Ledger::Recompute(nodes, {}, ledger_.Reservations());
  const Result r = RunOn(GpuPod("p", "1", "16000"), {"n1", "n2"}, *copy);
  ASSERT_TRUE(r.decision.winner.has_value());
  EXPECT_EQ(candidates_[*r.decision.winner].name, "n1");
  EXPECT_EQ(ledger_.View("n1")->usage[0].usedmem, 12000);
}

TEST_F(CycleTest, UnknownNodesComeFromTheCaller) {
  const kube::Pod pod = GpuPod("p", "1", "8000");
  decoded_ = Decode(*vendor_, pod, DecodeMode::kFilter);
  candidates_ = Candidates({"n1", "template"});
  std::vector<size_t> asked;
  const Result r = cycle::Run({},
                              {.pod = &pod,
                               .request = &decoded_.request,
                               .constraints = &decoded_.constraints,
                               .ledger = &ledger_,
                               .unknown = [&](size_t i) -> std::optional<device::NodeSnapshot> {
                                 asked.push_back(i);
                                 device::NodeSnapshot snap;
                                 snap.devices =
                                     ::tessera::testing::GpuNodeDevices("template", {"GPU-t"});
                                 snap.usage.resize(1);
                                 return snap;
                               }},
                              &candidates_);
  EXPECT_THAT(asked, ElementsAre(1u));  // only for the node the ledger does not know
  ASSERT_TRUE(r.decision.winner.has_value());
  EXPECT_EQ(candidates_[*r.decision.winner].name, "template");
}

TEST_F(CycleTest, APassThroughPodMarksEveryNodeFitAndReservesNothing) {
  const kube::Pod pod = GpuPod("p", "", "");
  const Decoded d = Decode(*vendor_, pod, DecodeMode::kStrict);
  ASSERT_EQ(d.code, DecodeCode::kPassThrough);
  candidates_ = Candidates({"n1", "ghost"});
  const Result r = cycle::Run({},
                              {.pod = &pod,
                               .request = &d.request,
                               .constraints = &d.constraints,
                               .ledger = &ledger_,
                               .reserve_in = &ledger_},
                              &candidates_);
  EXPECT_TRUE(r.decision.no_request);
  EXPECT_FALSE(r.decision.winner.has_value());
  EXPECT_TRUE(r.decision.nodes[0].fit);
  EXPECT_TRUE(r.decision.nodes[1].fit);
  EXPECT_TRUE(candidates_[0].snapshot.has_value());  // still snapshotted (explain shows it)
  EXPECT_THAT(r.diagnosis.failed, IsEmpty());
  EXPECT_TRUE(r.reserved.ok());
  EXPECT_FALSE(ledger_.HasReservation("uid-p"));
}

}  // namespace
}  // namespace tessera::cycle
