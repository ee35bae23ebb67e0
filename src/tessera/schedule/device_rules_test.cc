// The seam between the Fitter and a device kind's rules (device_rules.h): which kind a request
// type dispatches to, and what the NVIDIA rules do with one container's candidates when called
// directly, without the Fitter's loop around them.
#include "tessera/schedule/device_rules.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::schedule {
namespace {

using device::ContainerRequest;
using device::DeviceInfo;
using device::NodeDevices;
using device::NodeSnapshot;

DeviceInfo Gpu(int index, std::string mode = "hami-core") {
  DeviceInfo d;
  d.id = "GPU-" + std::to_string(index);
  d.index = index;
  d.count = 10;
  d.devmem = 8000;
  d.devcore = 100;
  d.type = "NVIDIA-Tesla T4";
  d.mode = std::move(mode);
  return d;
}

NodeSnapshot Node(std::vector<DeviceInfo> devices) {
  auto nd = std::make_shared<NodeDevices>();
  nd->node = "node1";
  nd->devices = std::move(devices);
  NodeSnapshot s;
  s.usage.assign(nd->devices.size(), device::DeviceUsage{});
  s.devices = std::move(nd);
  return s;
}

// Every device of `node` a candidate, in position order (the walk tries the last first).
struct Candidates {
  explicit Candidates(const NodeSnapshot& node) {
    for (size_t i = 0; i < node.devices->devices.size(); ++i) {
      entries.push_back(
          Fitter::SortEntry{{0, 0, 0}, static_cast<int64_t>(i), static_cast<int32_t>(i)});
      rank.push_back(static_cast<int32_t>(i));
    }
  }
  std::vector<Fitter::SortEntry> entries;
  std::vector<int32_t> rank;
};

struct Walked {
  std::vector<Fitter::Taken> taken;
  std::array<int32_t, kReasonCount> counts{};
  bool may_exceed = false;
};

// Runs `kind`'s rules for the one container of a pod asking `request` on `node`.
Walked WalkOne(DeviceKind kind, const NodeSnapshot& node, const ContainerRequest& request) {
  device::PodRequest pod;
  pod.containers.push_back(request);
  const device::PodConstraints constraints;
  const device::GpuPolicy policy;
  std::unique_ptr<DeviceRules> rules = NewDeviceRules(kind);
  rules->Prepare(pod, constraints, policy);
  Fitter fitter;  // not prepared: no quota
  const Candidates c(node);
  Walked out;
  ContainerWalk walk{.request = *pod.containers[0],
                     .node = node,
                     .usage = node.usage,
                     .entries = c.entries,
                     .rank = c.rank.data(),
                     .earlier = {},
                     .taken = &out.taken,
                     .app = true,
                     .fitter = &fitter};
  out.may_exceed = rules->MayExceedCandidates(0, walk);
  rules->Walk(0, walk);
  out.counts = walk.counts;
  return out;
}

ContainerRequest Req(int32_t nums, int32_t mem, std::string type = "NVIDIA") {
  ContainerRequest r;
  r.nums = nums;
  r.memreq = mem;
  r.type = std::move(type);
  return r;
}

int32_t Count(const Walked& w, Reason r) { return w.counts[static_cast<size_t>(r)]; }

TEST(DeviceRulesTest, TheRequestsFamilyChoosesTheRules) {
  ContainerRequest r = Req(1, 0, "NVIDIA");
  EXPECT_EQ(KindOf(r), DeviceKind::kNvidia);
  r.type = "Ascend910B3";  // an NVIDIA request of another type: NVIDIA's rules refuse it
  EXPECT_EQ(KindOf(r), DeviceKind::kNvidia);
  r.family = device::DeviceFamily::kAscend;
  EXPECT_EQ(KindOf(r), DeviceKind::kAscend);
  EXPECT_NE(NewDeviceRules(DeviceKind::kNvidia), nullptr);
  EXPECT_NE(NewDeviceRules(DeviceKind::kAscend), nullptr);
}

TEST(DeviceRulesTest, NvidiaRulesTakeFromTheEndAndCountTheSkipped) {
  std::vector<DeviceInfo> gpus = {Gpu(0), Gpu(1), Gpu(2)};
  gpus[2].health = false;
  const NodeSnapshot node = Node(gpus);
  const Walked w = WalkOne(DeviceKind::kNvidia, node, Req(1, 1000));
  ASSERT_EQ(w.taken.size(), 1U);
  EXPECT_EQ(w.taken[0].device, 1);  // the last candidate is unhealthy: the one before it
  EXPECT_EQ(w.taken[0].usedmem, 1000);
  EXPECT_EQ(w.taken[0].rank, 1);
  EXPECT_EQ(Count(w, Reason::kCardNotHealth), 1);
  EXPECT_FALSE(w.may_exceed);
}

TEST(DeviceRulesTest, NvidiaRulesRefuseAnotherVendorsRequestAsTypeMismatch) {
  const NodeSnapshot node = Node({Gpu(0), Gpu(1)});
  const Walked w = WalkOne(DeviceKind::kNvidia, node, Req(1, 1000, "NVIDIA-Tesla"));
  EXPECT_TRUE(w.taken.empty());
  EXPECT_EQ(Count(w, Reason::kCardTypeMismatch), 2);
}

TEST(DeviceRulesTest, NvidiaRulesLetAMigRequestAskForMoreThanItsCards) {
  const NodeSnapshot node = Node({Gpu(0, "mig")});
  EXPECT_TRUE(WalkOne(DeviceKind::kNvidia, node, Req(2, 1000)).may_exceed);
  EXPECT_FALSE(WalkOne(DeviceKind::kNvidia, Node({Gpu(0)}), Req(2, 1000)).may_exceed);
}

}  // namespace
}  // namespace tessera::schedule
