// Memory budget: at 100,000 allocation records over 5,000 nodes x 8 GPUs the ledger must spend
// at most 256 bytes per record, counted as live heap bytes (tessera/ledger/heap_counter.h).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "tessera/ledger/heap_counter.h"
#include "tessera/ledger/ledger.h"
#include "tessera/testing/ledger_cluster.h"

namespace tessera::ledger {
namespace {

TEST(LedgerMemoryTest, AtMost256BytesPerRecordAt100kRecords) {
  constexpr int kNodes = 5000;
  constexpr int kGpus = 8;
  constexpr int kRecords = 100000;
  Ledger ledger;
  for (int n = 0; n < kNodes; ++n) {
    ASSERT_TRUE(ledger.SetNode(::tessera::testing::ClusterNode(n, kGpus)).ok());
  }
  // Build the inputs first so that only the ledger's own allocations are measured.
  std::vector<PodAllocation> pods;
  pods.reserve(kRecords);
  for (int i = 0; i < kRecords; ++i) {
    pods.push_back(::tessera::testing::ClusterPod(i, kNodes, kGpus));
  }
  const int64_t before = LiveHeapBytes();
  for (const auto& p : pods) {
    ASSERT_TRUE(ledger.Apply(p).ok());
  }
  const int64_t after = LiveHeapBytes();
  const double per_record = static_cast<double>(after - before) / kRecords;
  std::printf("ledger heap: %.1f bytes per record (%lld bytes for %d records)\n", per_record,
              static_cast<long long>(after - before), kRecords);
  EXPECT_LE(per_record, 256.0);
  EXPECT_EQ(ledger.Full().records, static_cast<size_t>(kRecords));
}

}  // namespace
}  // namespace tessera::ledger
