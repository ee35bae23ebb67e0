#include "tessera/kube/objects.h"

#include <string>

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
  // Ascend: the pod's mode and runtime info, the node's consent to hami-core mode.
  EXPECT_TRUE(TrackedAnnotation("huawei.com/vnpu-mode"));
  EXPECT_TRUE(TrackedAnnotation("huawei.com/Ascend910B3"));
  EXPECT_TRUE(TrackedAnnotation("hami-vnpu-core"));
  EXPECT_FALSE(TrackedAnnotation("hami-vnpu-core-x"));
  EXPECT_FALSE(TrackedAnnotation("kubectl.kubernetes.io/last-applied-configuration"));
  EXPECT_FALSE(TrackedAnnotation("hami.io"));
  EXPECT_FALSE(TrackedAnnotation("xhami.io/a"));
  EXPECT_TRUE(TrackedPodLabel("hami.io/vgpu-node"));
  EXPECT_FALSE(TrackedPodLabel("app"));
}

TEST(ShortStringTest, InlineUpTo15BytesHeapBeyond) {
  for (size_t n : {0, 1, 14, 15, 16, 17, 100}) {
    const std::string text(n, 'q');
    ShortString s(text);
    EXPECT_EQ(s.view(), text) << n;
    EXPECT_EQ(s.size(), n);
    ShortString copy(s);
    EXPECT_EQ(copy, s);
    ShortString moved(std::move(copy));
    EXPECT_EQ(moved.view(), text);
    EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
    ShortString assigned("x");
    assigned = s;
    EXPECT_EQ(assigned.view(), text);
    assigned = ShortString("12345678901234567890");
    EXPECT_EQ(assigned.view(), "12345678901234567890");
    assigned = std::move(moved);
    EXPECT_EQ(assigned.view(), text);
  }
  EXPECT_EQ(sizeof(ShortString), 16u);
  EXPECT_TRUE(ShortString("16Gi") == std::string_view("16Gi"));
}

TEST(ResourceListTest, SameBehaviourAsStringMap) {
  ResourceList m{{"nvidia.com/gpumem", "3000"}, {"cpu", "100m"}, {"cpu", "2"}};
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.Get("cpu"), "2");
  EXPECT_EQ(m.Get("memory", "none"), "none");
  m.Set("memory", std::string("1000000000000000000000"));
  EXPECT_EQ(*m.Find("memory"), std::string_view("1000000000000000000000"));
  ResourceList copy = m;
  EXPECT_EQ(copy, m);
  EXPECT_TRUE(copy.Erase("cpu"));
  EXPECT_NE(copy, m);
  EXPECT_EQ(sizeof(ResourceList::Entry), 32u);
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
  pod.meta.deleting = true;
  EXPECT_TRUE(pod.Deleting());
}

TEST(NamesTest, DnsSubdomainAndLabelFollowKubernetes) {
  for (const char* ok : {"a", "gpu-node-1", "node.example.com", "0", "a-b.c-d", "1.2.3.4"}) {
    EXPECT_TRUE(IsDnsSubdomain(ok)) << ok;
  }
  for (const char* bad :
       {"", "-a", "a-", "A", "a_b", "a..b", ".a", "a.", "a/b", "..", "a b", "a.-b", "%2e"}) {
    EXPECT_FALSE(IsDnsSubdomain(bad)) << bad;
  }
  EXPECT_TRUE(IsDnsSubdomain(std::string(253, 'a')));
  EXPECT_FALSE(IsDnsSubdomain(std::string(254, 'a')));
  for (const char* ok : {"default", "kube-system", "a", "9"}) {
    EXPECT_TRUE(IsDnsLabel(ok)) << ok;
  }
  for (const char* bad : {"", "a.b", "-a", "a-", "Default", "a_b"}) {
    EXPECT_FALSE(IsDnsLabel(bad)) << bad;
  }
  EXPECT_TRUE(IsDnsLabel(std::string(63, 'a')));
  EXPECT_FALSE(IsDnsLabel(std::string(64, 'a')));
}

}  // namespace
}  // namespace tessera::kube
