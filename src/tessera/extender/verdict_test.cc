// The verdict document (verdict.h): its content from a ledger, the nearest miss, the 1 KiB bound
// and the round trip through its decoder.
#include "tessera/extender/verdict.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/device/mig.h"
#include "tessera/schedule/fit.h"
#include "tessera/testing/objects.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

const absl::Time kNow = absl::FromUnixSeconds(1767225600);  // 2026-01-01T00:00:00Z

std::shared_ptr<const device::NodeDevices> Node(const std::string& name,
                                                std::vector<device::DeviceInfo> devices) {
  auto node = std::make_shared<device::NodeDevices>();
  node->node = name;
  node->devices = std::move(devices);
  return node;
}

device::DeviceInfo Gpu(const std::string& id, int index, int mem = 8000, bool health = true) {
  return device::DeviceInfo{.id = id,
                            .index = index,
                            .count = 10,
                            .devmem = mem,
                            .devcore = 100,
                            .type = "NVIDIA-Tesla T4",
                            .health = health};
}

device::PodRequest Asks(int32_t mib, int32_t cores = 0) {
  device::PodRequest r;
  r.containers.push_back(device::ContainerRequest{.nums = 1, .memreq = mib, .coresreq = cores});
  return r;
}

FailedNode Failed(const std::string& node, schedule::Reason reason, int32_t count, int32_t total) {
  FailedNode f;
  f.node = node;
  f.parts.AssignOne({reason, count, total});
  return f;
}

class VerdictTest : public ::testing::Test {
 protected:
  // gpu-1: an 8000 MiB device with 3000 MiB held by a bound pod and 2048 by a reservation (2952
  // free), and an unhealthy one; gpu-2: a 16000 MiB device with 10000 held (6000 free); gpu-3:
  // no registration.
  void SetUp() override {
    ASSERT_TRUE(
        ledger_.SetNode(Node("gpu-1", {Gpu("GPU-a1", 0), Gpu("GPU-sick", 1, 8000, false)})).ok());
    ASSERT_TRUE(ledger_.SetNode(Node("gpu-2", {Gpu("GPU-b1", 0, 16000)})).ok());
    Hold("u-run", "infer-1", "gpu-1", "GPU-a1", 3000);
    ASSERT_TRUE(ledger_
                    .Reserve("u-res", "ml", "train-7", "gpu-1", {{{"GPU-a1", "NVIDIA", 2048, 0}}},
                             kNow + absl::Minutes(3))
                    .ok());
    Hold("u-big", "big", "gpu-2", "GPU-b1", 10000);
  }

  // Pod ml/<name> (uid `uid`), bound to `node`, holds `mib` MiB of device `uuid`.
  void Hold(const std::string& uid, const std::string& name, const std::string& node,
            const std::string& uuid, int32_t mib) {
    ASSERT_TRUE(
        ledger_
            .Apply(
                {uid, "ml", name, node, node, false, false, false, {{{uuid, "NVIDIA", mib, 0}}}, 0})
            .ok());
  }

  Verdict Build(const device::PodRequest& request,
                std::function<std::string(std::string_view)> lock_of = nullptr) {
    std::vector<std::string_view> names = {"gpu-1", "gpu-2", "gpu-3"};
    std::vector<std::optional<device::NodeSnapshot>> snaps = ledger_.Snapshot(names);
    candidates_.clear();
    for (size_t i = 0; i < names.size(); ++i) {
      candidates_.push_back({std::string(names[i]), std::move(snaps[i])});
    }
    failed_ = {Failed("gpu-1", schedule::Reason::kCardInsufficientMemory, 1, 1),
               Failed("gpu-2", schedule::Reason::kCardInsufficientMemory, 1, 1)};
    FailedNode unregistered;
    unregistered.node = "gpu-3";
    unregistered.failure = NodeFailure::kUnregistered;
    failed_.push_back(unregistered);
    return BuildVerdict({.request = &request,
                         .candidates = candidates_,
                         .failed = &failed_,
                         .ledger = &ledger_,
                         .lock_of = std::move(lock_of),
                         .withheld = nullptr});
  }

  ledger::Ledger ledger_;
  std::vector<schedule::Candidate> candidates_;
  std::vector<FailedNode> failed_;
};

TEST_F(VerdictTest, CountsReasonsAndBlockers) {
  const Verdict v = Build(Asks(7000));
  EXPECT_EQ(v.reason, "CardInsufficientMemory");
  EXPECT_EQ(v.nodes, 3);
  EXPECT_THAT(v.reasons,
              ElementsAre(Pair("CardInsufficientMemory", 2), Pair("node unregistered", 1)));
  EXPECT_EQ(v.unregistered, 1);
  EXPECT_EQ(v.unhealthy, 1);  // GPU-sick
  EXPECT_EQ(v.blocked, 0);
  EXPECT_FALSE(v.lock.has_value());
}

// gpu-2's device misses 7000 MiB by 1000 (6000 free), gpu-1's by 4048 (2952 free): gpu-2 is the
// nearest; the unhealthy device (8000 free) is never proposed.
TEST_F(VerdictTest, NearestMissIsTheSmallestShortfallOnAUsableDevice) {
  const Verdict v = Build(Asks(7000));
  ASSERT_TRUE(v.nearest.has_value());
  EXPECT_EQ(v.nearest->node, "gpu-2");
  EXPECT_EQ(v.nearest->device, "GPU-b1");
  EXPECT_EQ(v.nearest->need_mib, 7000);
  EXPECT_EQ(v.nearest->free_mib, 6000);
  ASSERT_EQ(v.nearest->held_by.size(), 1u);
  EXPECT_EQ(v.nearest->held_by[0].pod, "ml/big");
  EXPECT_EQ(v.nearest->held_by[0].mib, 10000);
  EXPECT_FALSE(v.nearest->held_by[0].reserved_until.has_value());
}

// The nearest miss is a device of the type the pod asks for, matched as HAMi matches types
// (a substring, without case); a pod asking a type no candidate has gets none.
TEST_F(VerdictTest, NearestMissIsOfTheRequestedType) {
  device::PodRequest t4 = Asks(7000);
  t4.containers[0]->type = "tesla T4";
  const Verdict v = Build(t4);
  ASSERT_TRUE(v.nearest.has_value());
  EXPECT_EQ(v.nearest->device, "GPU-b1");
  device::PodRequest a100 = Asks(7000);
  a100.containers[0]->type = "A100";
  EXPECT_FALSE(Build(a100).nearest.has_value());
}

// Once gpu-2 is nearly full, gpu-1 misses 3000 MiB by 48 and the verdict names who holds its
// memory: the bound pod, and the reservation with its expiry.
TEST_F(VerdictTest, NearestMissNamesTheReservationHoldingTheDevice) {
  const Verdict v = Build(Asks(3000));
  // gpu-2 has 6000 free: 3000 fits there, so its device is no shortfall at all and is nearest.
  ASSERT_TRUE(v.nearest.has_value());
  EXPECT_EQ(v.nearest->node, "gpu-2");

  // With gpu-2 asked for more than it has, gpu-1 (2952 free) misses 3000 by 48 MiB.
  Hold("u-big", "big", "gpu-2", "GPU-b1", 15000);
  const Verdict w = Build(Asks(3000));
  ASSERT_TRUE(w.nearest.has_value());
  EXPECT_EQ(w.nearest->node, "gpu-1");
  EXPECT_EQ(w.nearest->device, "GPU-a1");
  EXPECT_EQ(w.nearest->need_mib - w.nearest->free_mib, 48);
  ASSERT_EQ(w.nearest->held_by.size(), 2u);
  EXPECT_EQ(w.nearest->held_by[0].pod, "ml/infer-1");
  EXPECT_EQ(w.nearest->held_by[1].pod, "ml/train-7");
  EXPECT_EQ(w.nearest->held_by[1].mib, 2048);
  EXPECT_EQ(w.nearest->held_by[1].reserved_until, kNow + absl::Minutes(3));

  const std::string text = FormatVerdict(w, kNow + absl::Seconds(48));
  EXPECT_THAT(text, HasSubstr("nearest miss: node gpu-1 / GPU-a1: needs 3000 MiB, 2952 free"));
  EXPECT_THAT(text, HasSubstr("2048 MiB held by the reservation of ml/train-7, expires in 2m12s"));
  EXPECT_THAT(text, HasSubstr("3000 MiB held by ml/infer-1"));
}

TEST_F(VerdictTest, NodeLockOnTheNearestNodeIsABlocker) {
  const Verdict v = Build(Asks(7000), [](std::string_view node) {
    return node == "gpu-2" ? std::string("2025-12-31T23:58:00Z,ml,other") : std::string();
  });
  ASSERT_TRUE(v.lock.has_value());
  EXPECT_EQ(v.lock->node, "gpu-2");
  EXPECT_EQ(v.lock->holder, "ml/other");
  EXPECT_EQ(v.lock->since, kNow - absl::Minutes(2));
  EXPECT_THAT(FormatVerdict(v, kNow), HasSubstr("node lock on gpu-2 held by ml/other since "
                                                "2025-12-31T23:58:00Z (2m ago)"));
}

// A node whose device plugin stopped reporting stays in the ledger with every device unhealthy
// (accounting/node_registry.h), so its filter reason is CardNotHealth. Its owner must read "the
// device plugin stopped reporting", as HAMi's filter names such a node, not "devices unhealthy"
// (seen on the real control plane: test/controlplane/why_test.sh).
TEST(VerdictWithheld, ANodeWhosePluginStoppedReportingIsUnregisteredNotUnhealthy) {
  ledger::Ledger ledger;
  ASSERT_TRUE(
      ledger.SetNode(Node("silent", {Gpu("GPU-s0", 0, 8000, false), Gpu("GPU-s1", 1, 8000, false)}))
          .ok());
  ASSERT_TRUE(ledger.SetNode(Node("sick", {Gpu("GPU-x0", 0, 8000, false)})).ok());
  std::vector<std::string_view> names = {"silent", "sick"};
  std::vector<std::optional<device::NodeSnapshot>> snaps = ledger.Snapshot(names);
  std::vector<schedule::Candidate> candidates;
  for (size_t i = 0; i < names.size(); ++i) {
    candidates.push_back({std::string(names[i]), std::move(snaps[i])});
  }
  const std::vector<FailedNode> failed = {Failed("silent", schedule::Reason::kCardNotHealth, 2, 2),
                                          Failed("sick", schedule::Reason::kCardNotHealth, 1, 1)};
  const device::PodRequest request = Asks(1000);
  const Verdict v =
      BuildVerdict({.request = &request,
                    .candidates = candidates,
                    .failed = &failed,
                    .ledger = &ledger,
                    .lock_of = nullptr,
                    .withheld = [](std::string_view node) { return node == "silent"; }});
  EXPECT_EQ(v.unregistered, 1);
  EXPECT_EQ(v.unhealthy, 1);  // GPU-x0 only
  EXPECT_THAT(v.reasons, ElementsAre(Pair("CardNotHealth", 1), Pair("node unregistered", 1)));
  EXPECT_FALSE(v.nearest.has_value());
  EXPECT_THAT(FormatVerdict(v, kNow),
              HasSubstr("1 node without a device registration (the device plugin stopped "
                        "reporting or the handshake expired)\n1 device unhealthy or cordoned\n"));
}

// A MIG card whose free slices cannot hold the profile a pod needs: the verdict names the card,
// the profile, the placement the fewest instances block, and the pods holding instances there.
TEST(VerdictMig, AMigRequestThatFitsNoPlacementNamesTheCardTheProfileAndTheHolders) {
  ledger::Ledger ledger;
  ASSERT_TRUE(ledger.SetNode(::tessera::testing::MigNodeDevices("m1", {"GPU-m0"})).ok());
  // Places a pod asking `mib` on m1 with the scheduler's fit and reserves what it chose.
  auto place = [&](const std::string& name, int32_t mib) {
    const device::PodRequest request = Asks(mib);  // Prepare keeps references: they outlive Fit
    const device::PodConstraints constraints;
    schedule::Fitter fitter;
    fitter.Prepare(request, constraints, device::GpuPolicy{});
    std::optional<device::NodeSnapshot> snap = ledger.Snapshot({"m1"})[0];
    ASSERT_TRUE(snap.has_value());
    ASSERT_TRUE(fitter.Fit(*snap)) << name;
    const device::PodDevices devices = fitter.BuildPodDevices(*snap);
    ASSERT_TRUE(ledger
                    .Reserve("u-" + name, "ml", name, "m1", devices, kNow + absl::Minutes(5), 0,
                             device::MigAllocationsOf(devices, fitter.BuildMigReservations(*snap)))
                    .ok());
  };
  place("small-a", 4000);  // 1g.5gb
  place("mid-b", 9000);    // 2g.10gb
  place("small-c", 4000);
  // 4 of 8 memory slices are used, yet no 3g.20gb placement (slices 0-3 or 4-7) is free.
  std::vector<std::string_view> names = {"m1"};
  std::vector<std::optional<device::NodeSnapshot>> snaps = ledger.Snapshot(names);
  std::vector<schedule::Candidate> candidates = {{"m1", std::move(snaps[0])}};
  const std::vector<FailedNode> failed = {
      Failed("m1", schedule::Reason::kCardMigTopologyInfeasible, 1, 1)};
  const device::PodRequest request = Asks(15000);
  const Verdict v = BuildVerdict({.request = &request,
                                  .candidates = candidates,
                                  .failed = &failed,
                                  .ledger = &ledger,
                                  .lock_of = nullptr,
                                  .withheld = nullptr});
  EXPECT_EQ(v.reason, "CardMigTopologyInfeasible");
  EXPECT_EQ(v.mig,
            "node m1 / GPU-m0: 3g.20gb (19968 MiB): no free placement; slices 0-3 would be free "
            "without the instance at slice 3; held by ml/mid-b, ml/small-a, ml/small-c");
  EXPECT_THAT(FormatVerdict(v, kNow), HasSubstr("\nmig: node m1 / GPU-m0: 3g.20gb"));
  const std::string json = EncodeVerdict(v);
  EXPECT_LE(json.size(), kMaxVerdictBytes);
  absl::StatusOr<Verdict> back = DecodeVerdict(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, v);
  // A pod whose failure is not MIG's has no MIG line.
  const std::vector<FailedNode> memory = {
      Failed("m1", schedule::Reason::kCardInsufficientMemory, 1, 1)};
  EXPECT_EQ(BuildVerdict({.request = &request,
                          .candidates = candidates,
                          .failed = &memory,
                          .ledger = &ledger,
                          .lock_of = nullptr,
                          .withheld = nullptr})
                .mig,
            "");
}

TEST_F(VerdictTest, EncodesAndDecodesTheSameVerdict) {
  const Verdict v = Build(
      Asks(3000), [](std::string_view) { return std::string("2025-12-31T23:58:00Z,ml,other"); });
  const std::string json = EncodeVerdict(v);
  EXPECT_LE(json.size(), kMaxVerdictBytes);
  absl::StatusOr<Verdict> back = DecodeVerdict(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, v);
  // The same state gives the same bytes (the writer compares them).
  EXPECT_EQ(EncodeVerdict(Build(
                Asks(3000),
                [](std::string_view) { return std::string("2025-12-31T23:58:00Z,ml,other"); })),
            json);
}

// Why preemption did not help travels with the verdict and is printed for people.
TEST(VerdictPreemption, TheNoteRoundTripsAndIsPrinted) {
  Verdict v;
  v.reason = "CardInsufficientMemory";
  v.nodes = 2;
  v.preemption = "no eviction of lower-priority pods frees a GPU share on 2 nodes";
  const std::string json = EncodeVerdict(v);
  EXPECT_NE(json.find(R"("preemption":"no eviction of lower-priority pods)"), std::string::npos)
      << json;
  absl::StatusOr<Verdict> back = DecodeVerdict(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, v);
  EXPECT_NE(FormatVerdict(v, absl::FromUnixSeconds(0))
                .find("preemption: no eviction of lower-priority pods frees a GPU share on 2 "
                      "nodes\n"),
            std::string::npos)
      << FormatVerdict(v, absl::FromUnixSeconds(0));
  Verdict bare = v;
  bare.preemption.clear();
  EXPECT_EQ(EncodeVerdict(bare).find("preemption"), std::string::npos)
      << "a verdict without a note carries no key";
  EXPECT_FALSE(DecodeVerdict(R"({"v":1,"reason":"x","nodes":1,"preemption":3})").ok());
}

TEST(VerdictBound, LongNamesLoseDetailNotTheBound) {
  Verdict v;
  v.reason = "CardInsufficientMemory";
  v.nodes = 5000;
  for (std::string_view r : PendingReasons()) {
    v.reasons.emplace_back(std::string(r), 4999);
  }
  NearestMiss m;
  m.node = std::string(128, 'n');
  m.device = std::string(128, 'd');
  for (int i = 0; i < 3; ++i) {
    m.held_by.push_back({std::string(128, static_cast<char>('a' + i)), 1000, 0, kNow});
  }
  m.more_holders = 40;
  v.nearest = m;
  v.lock = LockBlocker{std::string(128, 'n'), std::string(128, 'h'), kNow};
  v.blocked = 1;
  v.blocked_by = std::string(128, 'b');
  const std::string json = EncodeVerdict(v);
  EXPECT_LE(json.size(), kMaxVerdictBytes);
  absl::StatusOr<Verdict> back = DecodeVerdict(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->reason, "CardInsufficientMemory");
  EXPECT_EQ(back->nodes, 5000);
  // What was left out is counted, not lost silently: holders become "more".
  if (back->nearest) {
    EXPECT_EQ(back->nearest->held_by.size() + static_cast<size_t>(back->nearest->more_holders),
              43u);
  }
}

TEST(VerdictDecode, RejectsWhatIsNotAVerdict) {
  for (std::string_view bad :
       {"", "[]", "{}", "{\"v\":2}", "{\"v\":1,\"nodes\":\"x\"}", "{\"v\":1,\"reasons\":[[\"a\"]]}",
        "{\"v\":1,\"nearest\":[]}", "{\"v\":1,\"lock\":{\"since\":\"yesterday\"}}", "{\"v\":1"}) {
    absl::StatusOr<Verdict> v = DecodeVerdict(bad);
    EXPECT_FALSE(v.ok()) << bad;
    if (!v.ok()) {
      EXPECT_THAT(v.status().message(), HasSubstr("not a Tessera verdict")) << bad;
    }
  }
  EXPECT_FALSE(DecodeVerdict(std::string(5000, ' ')).ok());
}

// verdict_fuzz's property over its seeds and their one-byte edits and truncations (the fuzz build
// needs clang): what decodes re-encodes within the bound, stably.
TEST(VerdictDecode, WhatDecodesReEncodesWithinTheBound) {
  const std::string seed =
      R"({"v":1,"reason":"node unregistered","nodes":3,"reasons":[["node unregistered",2]],)"
      R"("nearest":{"node":"n","device":"GPU-1","need_mib":9000,"free_mib":8000,"held_by":)"
      R"([{"pod":"ml/a","mib":1000,"cores":0,"reserved_until":"2026-01-01T00:03:00Z"}]},)"
      R"("lock":{"node":"n","holder":"ml/b","since":"2026-01-01T00:00:00Z"},"blocked":1,)"
      R"("blocked_by":"ml/broken","quota":"q"})";
  std::vector<std::string> inputs;
  for (size_t i = 0; i < seed.size(); ++i) {
    inputs.push_back(seed.substr(0, i));
    for (char c : {'0', '"', '[', '{', 'x', '\xff'}) {
      std::string edited = seed;
      edited[i] = c;
      inputs.push_back(std::move(edited));
    }
  }
  inputs.push_back(seed);
  std::string long_reason = seed;
  long_reason.replace(long_reason.find("node unregistered"), 17, std::string(3000, 'r'));
  inputs.push_back(long_reason);
  size_t decoded = 0;
  for (const std::string& in : inputs) {
    absl::StatusOr<Verdict> v = DecodeVerdict(in);
    if (!v.ok()) {
      EXPECT_FALSE(v.status().message().empty());
      continue;
    }
    ++decoded;
    const std::string out = EncodeVerdict(*v);
    EXPECT_LE(out.size(), kMaxVerdictBytes) << in;
    absl::StatusOr<Verdict> back = DecodeVerdict(out);
    ASSERT_TRUE(back.ok()) << back.status() << " from " << out;
    EXPECT_EQ(EncodeVerdict(*back), out);
  }
  EXPECT_GT(decoded, 10u);
}

TEST(VerdictReasons, TheLabelSetIsFixedAndMainReasonIsInIt) {
  const std::vector<std::string_view> reasons = PendingReasons();
  EXPECT_EQ(reasons.size(), schedule::kReasonCount + 3 + 1);
  EXPECT_EQ(MainReason({}), kNoCandidatesReason);
  FailedNode blocked;
  blocked.failure = NodeFailure::kBlocked;
  EXPECT_EQ(MainReason({blocked}), schedule::kNodeBlockedReasonPrefix);
  EXPECT_THAT(reasons, ::testing::Contains(MainReason({blocked})));
}

}  // namespace
}  // namespace tessera::extender
