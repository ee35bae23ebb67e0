#include "tessera/kube/objects.h"

#include "gtest/gtest.h"

namespace tessera::kube {
namespace {

TEST(StringMapTest, SortedUniqueKeys) {
  StringMap m{{"b", "2"}, {"a", "1"}, {"b", "3"}};
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.begin()->first, "a");
  EXPECT_EQ(*m.Find("b"), "3");
  EXPECT_EQ(m.Find("c"), nullptr);
  EXPECT_EQ(m.Get("c", "dflt"), "dflt");
  m.Set("c", "4");
  EXPECT_TRUE(m.Contains("c"));
  EXPECT_TRUE(m.Erase("a"));
  EXPECT_FALSE(m.Erase("a"));
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m, (StringMap{{"c", "4"}, {"b", "3"}}));
}

TEST(StringMapTest, KeysAreInternedAndCopiesStayValid) {
  std::string key = "nvidia.com/gpumem";
  StringMap a;
  a.Set(key, "1");
  key.assign("overwritten-xxxxxxxxxxxx");  // the map does not view the caller's buffer
  StringMap b{{"nvidia.com/gpumem", "2"}};
  EXPECT_EQ(a.begin()->first, "nvidia.com/gpumem");
  EXPECT_EQ(a.begin()->first.data(), b.begin()->first.data());
  EXPECT_EQ(InternKey("nvidia.com/gpumem").data(), a.begin()->first.data());
  EXPECT_EQ(InternKey(""), "");
  StringMap c = a;
  a.Clear();
  EXPECT_EQ(c.Get("nvidia.com/gpumem"), "1");
  EXPECT_NE(a, c);
}

TEST(StringMapTest, TrackedKeys) {
  EXPECT_TRUE(TrackedAnnotation("hami.io/vgpu-node"));
  EXPECT_TRUE(TrackedAnnotation("nvidia.com/use-gputype"));
  EXPECT_FALSE(TrackedAnnotation("kubectl.kubernetes.io/last-applied-configuration"));
  EXPECT_FALSE(TrackedAnnotation("hami.io"));
  EXPECT_FALSE(TrackedAnnotation("xhami.io/a"));
  EXPECT_TRUE(TrackedPodLabel("hami.io/vgpu-node"));
  EXPECT_FALSE(TrackedPodLabel("app"));
}

TEST(PodTest, PhaseAndState) {
  EXPECT_EQ(ParsePodPhase(""), PodPhase::kPending);
  EXPECT_EQ(ParsePodPhase("Succeeded"), PodPhase::kSucceeded);
  EXPECT_EQ(ParsePodPhase("bogus"), PodPhase::kUnknown);
  EXPECT_EQ(PodPhaseName(PodPhase::kFailed), "Failed");
  Pod pod;
  pod.meta.ns = "default";
  pod.meta.name = "p";
  EXPECT_EQ(pod.Key(), "default/p");
  EXPECT_FALSE(pod.Terminal());
  pod.phase = PodPhase::kFailed;
  EXPECT_TRUE(pod.Terminal());
  EXPECT_FALSE(pod.Deleting());
  pod.meta.deletion_timestamp = "2026-01-01T00:00:00Z";
  EXPECT_TRUE(pod.Deleting());
}

}  // namespace
}  // namespace tessera::kube
