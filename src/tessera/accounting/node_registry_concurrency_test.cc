// NodeRegistry's thread-safety contract: Status, Find and Registrations from other threads
// while the informer worker observes, ticks and forgets (run under TSan in the tsan build).
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/accounting/node_registry.h"
#include "tessera/device/codec.h"
#include "tessera/device/vendor.h"
#include "tessera/ledger/ledger.h"

namespace tessera::accounting {
namespace {

TEST(RegistryConcurrencyTest, ReadersSeeConsistentStateWhileTheWorkerWrites) {
  std::unique_ptr<device::Vendor> vendor = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger;
  NodeRegistry registry(vendor.get(), &ledger, {});
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        for (const NodeStatus& s : registry.Status()) {
          // A node in the ledger always has its registration's devices.
          if (s.in_ledger) {
            ASSERT_EQ(s.devices, 1u);
          }
        }
        registry.Find("n3");
        for (const auto& r2 : registry.Registrations()) {
          ASSERT_EQ(r2->devices.size(), 1u);
        }
      }
    });
  }
  const absl::Time t0 = absl::FromUnixSeconds(1800000000);
  for (int i = 0; i < 2000; ++i) {
    const absl::Time now = t0 + absl::Seconds(i);
    kube::Node n;
    n.meta.name = "n" + std::to_string(i % 8);
    n.meta.resource_version = std::to_string(i);
    n.meta.annotations.Set("hami.io/node-nvidia-register",
                           "GPU-" + std::to_string(i % 8) + ",10,7680,100,T,0,true:");
    n.meta.annotations.Set("hami.io/node-handshake", device::FormatHandshakeReported(now));
    n.ready = kube::ConditionStatus::kTrue;
    registry.Observe(n, now);
    if (i % 7 == 0) {
      registry.Tick(now);
    }
    if (i % 11 == 0) {
      registry.Forget(n.meta.name);
    }
  }
  stop.store(true);
  for (std::thread& t : readers) {
    t.join();
  }
  EXPECT_EQ(registry.Registrations().size(), ledger.Full().nodes.size());
}

}  // namespace
}  // namespace tessera::accounting
