#include "tessera/accounting/quota_book.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/testing/objects.h"

namespace tessera::accounting {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

kube::ResourceQuota Rq(const std::string& ns, const std::string& name,
                       std::vector<std::pair<std::string, std::string>> hard) {
  kube::ResourceQuota q;
  q.meta.ns = ns;
  q.meta.name = name;
  for (auto& [k, v] : hard) {
    q.hard.Set(k, kube::ShortString(v));
  }
  return q;
}

std::shared_ptr<const device::NodeDevices> Node() {
  return ::tessera::testing::GpuNodeDevices("n1", {"GPU-a"}, 80000);
}

TEST(QuotaBookTest, NamespaceWithoutQuotaIsUnlimited) {
  QuotaBook book({});
  ledger::Ledger ledger;
  EXPECT_FALSE(book.Quota("ml", ledger).Limited());
  book.Upsert(Rq("ml", "other", {{"limits.cpu", "4"}}));
  EXPECT_FALSE(book.Quota("ml", ledger).Limited());
  EXPECT_THAT(book.AllLimits(), IsEmpty());
}

TEST(QuotaBookTest, EditsAndDeletesTakeEffectAtOnce) {
  // quota_test.go TestUpdateQuota: raising one limit and dropping the other; a key the new
  // object no longer carries is released. TestAddQuotaAndDelQuota: a delete clears it.
  QuotaBook book({});
  book.Upsert(Rq("ml", "gpu",
                 {{"limits.nvidia.com/gpumem", "1000"}, {"limits.nvidia.com/gpucores", "100"}}));
  EXPECT_EQ(book.Limits("ml").memory->limit, 1000);
  EXPECT_EQ(book.Limits("ml").cores->limit, 100);
  book.Upsert(Rq("ml", "gpu", {{"limits.nvidia.com/gpumem", "2000"}}));
  EXPECT_EQ(book.Limits("ml").memory->limit, 2000);
  EXPECT_FALSE(book.Limits("ml").cores.has_value());
  book.Remove("ml", "gpu");
  EXPECT_FALSE(book.Limits("ml").Limited());
}

TEST(QuotaBookTest, DeletingOneOfTwoObjectsKeepsTheOthersLimit) {
  // HAMi v2.10: deleting any object clears the limit even if another still sets it (a bug we do
  // not copy: docs/compatibility.md).
  QuotaBook book({});
  book.Upsert(Rq("ml", "a", {{"limits.nvidia.com/gpumem", "1000"}}));
  book.Upsert(Rq("ml", "b", {{"limits.nvidia.com/gpumem", "3000"}}));
  EXPECT_EQ(book.Limits("ml").memory, (schedule::QuotaLimit{1000, "a"}));
  book.Remove("ml", "a");
  EXPECT_EQ(book.Limits("ml").memory, (schedule::QuotaLimit{3000, "b"}));
  book.Replace({Rq("team", "x", {{"limits.nvidia.com/gpucores", "50"}})});
  EXPECT_FALSE(book.Limits("ml").Limited());
  ASSERT_EQ(book.AllLimits().size(), 1u);
  EXPECT_EQ(book.AllLimits()[0].ns, "team");
}

TEST(QuotaBookTest, UsageIsTheLedgersView) {
  QuotaBook book({.memory_factor = 1});
  book.Upsert(Rq("ml", "gpu", {{"limits.nvidia.com/gpumem", "40000"}}));
  ledger::Ledger ledger;
  ASSERT_TRUE(ledger.SetNode(Node()).ok());
  ASSERT_TRUE(ledger
                  .Reserve("u1", "ml", "p1", "n1", {{{"GPU-a", "NVIDIA", 36000, 0}}},
                           absl::InfiniteFuture())
                  .ok());
  schedule::NamespaceQuota q = book.Quota("ml", ledger);
  EXPECT_EQ(q.usedmem, 36000);
  EXPECT_FALSE(q.Fits(8000, 0));
  EXPECT_TRUE(q.Fits(4000, 0));
  EXPECT_EQ(schedule::QuotaMissText(q, {true, 8000}),
            "namespace ml: limits.nvidia.com/gpumem 40000, used 36000 + 8000 asked");
  ASSERT_TRUE(ledger.Release("u1"));
  EXPECT_EQ(book.Quota("ml", ledger).usedmem, 0);
}

TEST(QuotaBookTest, SkippedValuesAreListed) {
  QuotaBook book({});
  book.Upsert(Rq("ml", "gpu", {{"limits.nvidia.com/gpumem", "1.5"}}));
  EXPECT_FALSE(book.Limits("ml").Limited());
  EXPECT_THAT(book.Skipped(),
              ElementsAre(::testing::StartsWith("ml/gpu: limits.nvidia.com/gpumem")));
}

// The requeue's input (extender/requeue.h): each loosening counted when it happens.
TEST(QuotaBookTest, LoosenedSinceListsRaisedAndRemovedLimitsOnce) {
  QuotaBook book({});
  uint64_t cursor = 0;
  book.Upsert(Rq("ml", "gpu", {{"limits.nvidia.com/gpumem", "8000"}}));
  book.Upsert(Rq("cv", "gpu", {{"limits.nvidia.com/gpucores", "100"}}));
  book.Upsert(Rq("ml", "gpu", {{"limits.nvidia.com/gpumem", "4000"}}));  // lowered
  EXPECT_THAT(book.LoosenedSince(&cursor), IsEmpty());
  book.Upsert(Rq("ml", "gpu", {{"limits.nvidia.com/gpumem", "6000"}}));
  book.Remove("cv", "gpu");
  EXPECT_THAT(book.LoosenedSince(&cursor), ElementsAre("cv", "ml"));
  EXPECT_THAT(book.LoosenedSince(&cursor), IsEmpty());
  // Came and went between two calls; and a LIST without it.
  book.Upsert(Rq("cv", "gpu", {{"limits.nvidia.com/gpucores", "50"}}));
  book.Remove("cv", "gpu");
  EXPECT_THAT(book.LoosenedSince(&cursor), ElementsAre("cv"));
  book.Replace({Rq("cv", "gpu", {{"limits.nvidia.com/gpucores", "50"}})});
  EXPECT_THAT(book.LoosenedSince(&cursor), ElementsAre("ml"));
  uint64_t fresh = 0;
  EXPECT_THAT(book.LoosenedSince(&fresh), ElementsAre("cv", "ml"));
}

}  // namespace
}  // namespace tessera::accounting
