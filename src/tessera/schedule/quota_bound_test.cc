// The quota check's upper bound (Fitter::Prepare settles a pod, or a node, whose bound fits)
// never changes a decision: on random nodes (mixed card sizes), pods (init containers, fixed
// MiB, percentages, whole cards, cores), quotas near and far from their limits and GPU policies
// (topology-aware included), a Fitter that settles and one that checks every card agree on the
// fit, the cards chosen, the usage after, the reasons and the quota miss.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "tessera/schedule/fit.h"
#include "tessera/testing/objects.h"

namespace tessera::schedule {
namespace {

// Mixed card sizes, so a node's largest card matters for a percentage.
constexpr int32_t kCardSizes[] = {8000, 16000, 24576, 40960, 81920};

device::NodeSnapshot RandomNode(std::mt19937_64& rng, int index) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto devices = std::make_shared<device::NodeDevices>();
  devices->node = "n" + std::to_string(index);
  const int gpus = pick(1, 6);
  const bool mixed = pick(0, 2) == 0;
  const int32_t size = kCardSizes[pick(0, 4)];
  device::NodeSnapshot s;
  for (int g = 0; g < gpus; ++g) {
    device::DeviceInfo d =
        ::tessera::testing::GpuDevice("GPU-" + std::to_string(index) + "-" + std::to_string(g), g,
                                      mixed ? kCardSizes[pick(0, 4)] : size);
    d.numa = pick(0, 1);
    devices->devices.push_back(d);
    device::DeviceUsage u;
    u.used = pick(0, 3);
    u.usedmem = pick(0, d.devmem);
    u.usedcores = pick(0, 100);
    s.usage.push_back(u);
  }
  s.devices = std::move(devices);
  return s;
}

device::PodRequest RandomPod(std::mt19937_64& rng) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  device::PodRequest req;
  const int containers = pick(1, 5);
  req.init_count = static_cast<size_t>(pick(0, 2));
  for (int c = 0; c < containers; ++c) {
    if (pick(0, 5) == 0) {
      req.containers.emplace_back(std::nullopt);
      continue;
    }
    device::ContainerRequest r;
    r.nums = pick(1, 3);
    r.coresreq = pick(0, 4) == 0 ? 0 : pick(0, 120);
    switch (pick(0, 2)) {
      case 0:
        r.memreq = pick(100, 20000);
        break;
      case 1:
        r.mem_percentage = pick(1, 100);
        break;
      default:
        r.mem_percentage = 100;  // a whole card
        break;
    }
    req.containers.emplace_back(r);
  }
  return req;
}

NamespaceQuota RandomQuota(std::mt19937_64& rng) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  NamespaceQuota q;
  q.ns = "ml";
  q.memory_name = "nvidia.com/gpumem";
  q.cores_name = "nvidia.com/gpucores";
  q.memory_factor = pick(0, 3) == 0 ? 2 : 1;
  if (pick(0, 3) != 0) {
    q.memory = QuotaLimit{pick(0, 200000), "gpu"};
  }
  if (pick(0, 2) == 0) {
    q.cores = QuotaLimit{pick(0, 800), "gpu"};
  }
  // Usage near the limit as often as far below it.
  q.usedmem = q.memory ? std::max<int64_t>(0, q.MemoryLimit() - pick(0, 60000)) : pick(0, 1000);
  q.usedcores = q.cores ? std::max<int64_t>(0, q.cores->limit - pick(0, 400)) : 0;
  return q;
}

device::GpuPolicy RandomPolicy(std::mt19937_64& rng) {
  static const std::vector<std::vector<device::GpuPolicyKey>> kChains = {
      {device::GpuPolicyKey::kSpread},
      {device::GpuPolicyKey::kBinpack},
      {device::GpuPolicyKey::kMutex},
      {device::GpuPolicyKey::kTopologyAware},
      {device::GpuPolicyKey::kBinpack, device::GpuPolicyKey::kNuma}};
  return device::GpuPolicy{
      kChains[std::uniform_int_distribution<size_t>(0, kChains.size() - 1)(rng)]};
}

bool SameChoices(const std::vector<Fitter::Choice>& a, const std::vector<Fitter::Choice>& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].container != b[i].container || a[i].device != b[i].device ||
        a[i].usedmem != b[i].usedmem || a[i].usedcores != b[i].usedcores) {
      return false;
    }
  }
  return true;
}

TEST(QuotaBoundTest, SettlingNeverChangesADecision) {
  std::mt19937_64 rng(20261205);
  int fits = 0, refused = 0, other = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<device::NodeSnapshot> nodes;
    for (int n = 0; n < 6; ++n) {
      nodes.push_back(RandomNode(rng, n));
    }
    const device::PodRequest req = RandomPod(rng);
    const NamespaceQuota quota = RandomQuota(rng);
    const device::GpuPolicy policy = RandomPolicy(rng);
    device::PodConstraints constraints;
    constraints.numa_bind = std::uniform_int_distribution<int>(0, 4)(rng) == 0;
    Fitter settling, exact;
    settling.Prepare(req, constraints, policy, &quota);
    exact.Prepare(req, constraints, policy, &quota, /*settle_quota=*/false);
    for (const device::NodeSnapshot& node : nodes) {
      const bool a = settling.Fit(node);
      const bool b = exact.Fit(node);
      ASSERT_EQ(a, b) << "round " << round << " node " << node.devices->node;
      if (a) {
        ASSERT_TRUE(SameChoices(settling.choices(), exact.choices())) << "round " << round;
        ASSERT_EQ(settling.usage_after(), exact.usage_after()) << "round " << round;
        ++fits;
      } else {
        ASSERT_EQ(settling.failed_container(), exact.failed_container()) << "round " << round;
        ASSERT_EQ(settling.reasons().Joined(), exact.reasons().Joined()) << "round " << round;
        ++(settling.reasons().Joined().find("ResourceQuotaNotFit") != std::string::npos ? refused
                                                                                        : other);
      }
      ASSERT_EQ(settling.quota_miss(), exact.quota_miss()) << "round " << round;
    }
  }
  // Both sides of the bound were exercised: pods that fit and cards the quota refused.
  EXPECT_GT(fits, 1000);
  EXPECT_GT(refused, 1000);
  EXPECT_GT(other, 100);
}

}  // namespace
}  // namespace tessera::schedule
