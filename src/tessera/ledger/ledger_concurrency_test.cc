// Writers move pods between nodes, re-register nodes and churn reservations while readers take
// snapshots; every snapshot must be one consistent instant:
//   * per device: usedmem == 100 * used and usedcores == 10 * used (every entry is 100 MiB and
//     10 cores; this holds under the init-container collapse too), so a half-applied update is
//     visible; in full snapshots `used` also equals the collapse of the device's holders;
//   * across nodes a0..a3: exactly kMovers slots in use, since pods only move between them, so a
//     snapshot that saw a move's removal but not its addition (or the reverse) is visible.
// Runs under TSan (label concurrency).
#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

#include "tessera/ledger/ledger.h"
#include "tessera/testing/objects.h"

namespace tessera::ledger {
namespace {

using device::ContainerDevice;
using device::NodeDevices;

constexpr int kGpus = 4;
constexpr int kMovers = 48;  // pods that always exist, bound, on a0..a3
constexpr int kOps = 4000;   // per writer

std::shared_ptr<const NodeDevices> MakeNode(const std::string& name, std::mt19937* rng) {
  auto n = std::make_shared<NodeDevices>();
  n->node = name;
  for (int g = 0; g < kGpus; ++g) {
    n->devices.push_back(::tessera::testing::GpuDevice("GPU-" + name + "-" + std::to_string(g), g,
                                                       100000, /*type=*/"", 100, 1000));
  }
  if (rng != nullptr) {
    std::shuffle(n->devices.begin(), n->devices.end(), *rng);
  }
  return n;
}

PodAllocation Mover(int i, int node, int gpu) {
  PodAllocation p;
  p.uid = "mover-" + std::to_string(i);
  p.ns = "default";
  p.name = p.uid;
  p.node = "a" + std::to_string(node);
  p.bound_node = p.node;
  const std::string uuid = "GPU-" + p.node + "-" + std::to_string(gpu);
  p.devices = {{ContainerDevice{uuid, "NVIDIA", 100, 10}}};
  return p;
}

TEST(LedgerConcurrencyTest, SnapshotsAreConsistentWhileWritersApply) {
  Ledger ledger;
  const std::vector<std::string> names = {"a0", "a1", "a2", "a3", "b0", "b1"};
  for (const auto& n : names) {
    ASSERT_TRUE(ledger.SetNode(MakeNode(n, nullptr)).ok());
  }
  for (int i = 0; i < kMovers; ++i) {
    ASSERT_TRUE(ledger.Apply(Mover(i, i % 4, i % kGpus)).ok());
  }
  std::atomic<int> writers_left{3};
  std::atomic<int> failures{0};
  std::atomic<int64_t> snapshots{0};

  auto mover = [&](int seed, int first, int last) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    for (int op = 0; op < kOps; ++op) {
      const int i = first + static_cast<int>(rng() % static_cast<unsigned>(last - first));
      if (!ledger.Apply(Mover(i, static_cast<int>(rng() % 4), static_cast<int>(rng() % kGpus)))
               .ok()) {
        failures.fetch_add(1);
      }
      if (op % 97 == 0) {
        // Re-register a node with its devices in another order: indices move, UUIDs stay.
        if (!ledger.SetNode(MakeNode("a" + std::to_string(rng() % 4), &rng)).ok()) {
          failures.fetch_add(1);
        }
      }
    }
    writers_left.fetch_sub(1);
  };
  auto churner = [&]() {
    std::mt19937 rng(7);
    const absl::Time t0 = absl::FromUnixSeconds(1'800'000'000);
    for (int op = 0; op < kOps; ++op) {
      const std::string uid = "churn-" + std::to_string(rng() % 32);
      const std::string node = "b" + std::to_string(rng() % 2);
      // Two containers; container 0 is an init container in half the operations, so the same
      // device may be collapsed (init + app) or counted twice (app + app).
      const device::PodDevices devs = {
          {ContainerDevice{"GPU-" + node + "-" + std::to_string(rng() % kGpus), "NVIDIA", 100, 10}},
          {ContainerDevice{"GPU-" + node + "-" + std::to_string(rng() % kGpus), "NVIDIA", 100,
                           10}}};
      const auto init_count = static_cast<int32_t>(rng() % 2);
      switch (rng() % 5) {
        case 0:
          (void)ledger.Reserve(uid, "default", uid, node, devs, t0 + absl::Seconds(op % 50),
                               init_count);
          break;
        case 1: {
          PodAllocation p;
          p.uid = uid;
          p.ns = "default";
          p.name = uid;
          p.node = node;
          p.bound_node = node;
          p.devices = devs;
          p.init_count = init_count;
          (void)ledger.Apply(p);
          break;
        }
        case 2:
          ledger.Remove(uid);
          break;
        case 3:
          ledger.Release(uid);
          break;
        default:
          ledger.ExpireReservations(t0 + absl::Seconds(op % 50));
          break;
      }
    }
    writers_left.fetch_sub(1);
  };
  auto reader = [&](bool full) {
    const std::vector<std::string_view> views(names.begin(), names.end());
    while (writers_left.load() > 0) {
      int64_t used_a = 0;
      if (full) {
        const FullSnapshot snap = ledger.Full();
        if (snap.nodes.size() != names.size()) {
          failures.fetch_add(1);
          continue;
        }
        for (const NodeView& v : snap.nodes) {
          for (size_t d = 0; d < v.usage.size(); ++d) {
            // Holders are sorted by uid: per pod max(1 if an init entry, app entries).
            int32_t slots = 0;
            for (size_t h = 0; h < v.holders[d].size();) {
              size_t end = h;
              bool init = false;
              int32_t apps = 0;
              for (; end < v.holders[d].size() && v.holders[d][end].uid == v.holders[d][h].uid;
                   ++end) {
                init = init || v.holders[d][end].init;
                apps += v.holders[d][end].init ? 0 : 1;
              }
              slots += std::max(init ? 1 : 0, apps);
              h = end;
            }
            if (v.usage[d].used != slots || v.usage[d].usedmem != 100 * v.usage[d].used) {
              failures.fetch_add(1);
            }
            if (v.devices->node[0] == 'a') {
              used_a += v.usage[d].used;
            }
          }
        }
      } else {
        const auto snap = ledger.Snapshot(views);
        for (size_t i = 0; i < snap.size(); ++i) {
          if (!snap[i].has_value() || snap[i]->usage.size() != kGpus) {
            failures.fetch_add(1);
            continue;
          }
          for (const auto& u : snap[i]->usage) {
            if (u.used < 0 || u.usedmem != 100 * u.used || u.usedcores != 10 * u.used) {
              failures.fetch_add(1);
            }
            if (i < 4) {
              used_a += u.used;
            }
          }
        }
      }
      if (used_a != kMovers) {
        failures.fetch_add(1);
      }
      snapshots.fetch_add(1);
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(mover, 1, 0, kMovers / 2);
  threads.emplace_back(mover, 2, kMovers / 2, kMovers);
  threads.emplace_back(churner);
  threads.emplace_back(reader, false);
  threads.emplace_back(reader, true);
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(snapshots.load(), 0);
  // And after the dust settles, the incremental state equals a recompute of its own inputs.
  std::vector<std::shared_ptr<const NodeDevices>> nodes;
  for (const NodeView& v : ledger.Full().nodes) {
    nodes.push_back(v.devices);
  }
  auto fresh = Ledger::Recompute(nodes, ledger.Records(), ledger.Reservations());
  const LedgerDiff diff = Diff(ledger, *fresh);
  EXPECT_TRUE(diff.Empty()) << diff.ToString();
}

}  // namespace
// The NUMA refit's accounting against the informer's delete (HAMi #3027: a refit that removes
// and re-adds a pod's usage, racing a delete that removes it too, subtracts it twice and erases
// other pods' usage, or brings a deleted pod back). ReplaceContainer is one step, so whatever
// the order, the pod ends removed and the other pod's usage is exactly its own.
TEST(LedgerConcurrencyTest, RefitRacingDeleteNeitherResurrectsNorSubtractsTwice) {
  constexpr int kRounds = 300;
  const auto node = MakeNode("a0", nullptr);
  for (int round = 0; round < kRounds; ++round) {
    Ledger ledger;
    ASSERT_TRUE(ledger.SetNode(node).ok());
    PodAllocation other = Mover(0, 0, 1);  // on GPU-a0-1, where the refit moves the pod
    PodAllocation pod = Mover(1, 0, 0);
    ASSERT_TRUE(ledger.Apply(other).ok());
    ASSERT_TRUE(ledger.Apply(pod).ok());
    std::atomic<bool> go{false};
    std::thread deleter([&] {
      while (!go.load()) {
      }
      ledger.Remove(pod.uid);
    });
    std::thread refit([&] {
      while (!go.load()) {
      }
      absl::StatusOr<int> moved =
          ledger.ReplaceContainer(pod.uid, 0, pod.devices[0], Mover(1, 0, 1).devices[0]);
      // Either it ran first (moved) or the pod was already gone.
      EXPECT_TRUE(moved.ok() ? *moved == 1 : absl::IsNotFound(moved.status())) << moved.status();
    });
    go.store(true);
    deleter.join();
    refit.join();
    const auto truth = Ledger::Recompute({node}, {other}, {});
    const LedgerDiff diff = Diff(ledger, *truth);
    ASSERT_TRUE(diff.Empty()) << "round " << round << "\n" << diff.ToString();
  }
}

}  // namespace tessera::ledger
