#include "tessera/kube/manifest.h"

#include <cstdlib>
#include <string>

#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TestData(const std::string& name) {
  const char* root = std::getenv("TESSERA_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/test/testdata/kube/" + name;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(LoadManifestsTest, KubectlListOutput) {
  absl::StatusOr<Manifests> m = LoadManifestFile(TestData("cluster.yaml"));
  ASSERT_TRUE(m.ok()) << Message(m.status());
  ASSERT_EQ(m->nodes.size(), 1u);
  ASSERT_EQ(m->pods.size(), 1u);
  const Node& node = m->nodes[0];
  EXPECT_EQ(node.meta.name, "gpu-a");
  EXPECT_EQ(node.meta.labels.Get("gpu"), "on");
  // Annotations outside hami.io/ and nvidia.com/ are not kept (kube/objects.h).
  EXPECT_FALSE(node.meta.annotations.Contains("node.alpha.kubernetes.io/ttl"));
  // A folded single-quoted scalar joins its lines with a space.
  EXPECT_EQ(node.meta.annotations.Get("hami.io/node-nvidia-register"),
            "GPU-0a1b2c3d-0000-4000-8000-000000000001,10,24576,100,NVIDIA-NVIDIA L4,0,true:");
  EXPECT_EQ(node.allocatable.Get("nvidia.com/gpu"), "10");
  EXPECT_EQ(node.ready, ConditionStatus::kTrue);
  const Pod& pod = m->pods[0];
  EXPECT_EQ(pod.Key(), "serving/infer-0");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/replicas"), "3");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-devices-allocated"),
            "GPU-0a1b2c3d-0000-4000-8000-000000000001,NVIDIA,4096,25:;");
  EXPECT_EQ(pod.node_name, "gpu-a");
  EXPECT_EQ(pod.phase, PodPhase::kRunning);
  EXPECT_EQ(pod.containers.at(0).limits.Get("nvidia.com/gpumem"), "4096");
  EXPECT_THAT(m->warnings, ElementsAre(TestData("cluster.yaml") +
                                       ": document 1 items[2]: skipped Service serving/infer"));
}

TEST(LoadManifestsTest, MultiDocumentYamlWithUnquotedScalars) {
  absl::StatusOr<Manifests> m = LoadManifestFile(TestData("cluster-multi.yaml"));
  ASSERT_TRUE(m.ok()) << Message(m.status());
  ASSERT_EQ(m->nodes.size(), 1u);
  ASSERT_EQ(m->pods.size(), 1u);
  const Node& node = m->nodes[0];
  EXPECT_EQ(node.meta.labels, (StringMap{{"gpu", "on"}, {"zone", "1"}}));
  EXPECT_EQ(node.allocatable,
            (StringMap{{"cpu", "64"}, {"memory", "512Gi"}, {"nvidia.com/gpu", "8"}}));
  EXPECT_TRUE(node.unschedulable);
  EXPECT_EQ(node.ready, ConditionStatus::kFalse);
  const Pod& pod = m->pods[0];
  EXPECT_EQ(pod.Key(), "ml/trainer-x");
  EXPECT_EQ(pod.meta.annotations.Get("nvidia.com/build"), "0012");
  EXPECT_EQ(pod.meta.annotations.Get("nvidia.com/enabled"), "true");
  EXPECT_EQ(pod.init_containers.at(0).requests.Get("cpu"), "500m");
  const Container& main = pod.containers.at(0);
  EXPECT_TRUE(main.privileged);
  EXPECT_EQ(main.limits,
            (ResourceList{
                {"nvidia.com/gpu", "2"}, {"nvidia.com/gpumem-percentage", "50"}, {"cpu", "0.5"}}));
  EXPECT_EQ(main.requests.Get("memory"), "1e3Mi");
  EXPECT_EQ(pod.phase, PodPhase::kPending);
  const std::string src = TestData("cluster-multi.yaml");
  EXPECT_THAT(m->warnings, ElementsAre(src + ": document 3: skipped Deployment ml/trainer"));
}

TEST(LoadManifestsTest, JsonListAndConcatenatedObjects) {
  absl::StatusOr<Manifests> m = LoadManifestFile(TestData("cluster.json"));
  ASSERT_TRUE(m.ok()) << Message(m.status());
  ASSERT_EQ(m->nodes.size(), 1u);
  ASSERT_EQ(m->pods.size(), 1u);
  EXPECT_EQ(m->nodes[0].allocatable.Get("nvidia.com/gpu"), "4");
  EXPECT_EQ(m->pods[0].containers.at(0).limits.Get("nvidia.com/gpu"), "1");
  EXPECT_THAT(m->warnings, ElementsAre(HasSubstr("document 2: skipped ConfigMap default/cfg")));
}

TEST(LoadManifestsTest, ResourceQuotasAreKept) {
  // `kubectl get resourcequotas -A -o yaml` shape (a List) and a ResourceQuotaList without kinds.
  absl::StatusOr<Manifests> m = LoadManifests(R"(
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ResourceQuota
  metadata: {name: gpu, namespace: ml}
  spec:
    hard:
      limits.nvidia.com/gpumem: "40000"
      requests.cpu: "4"
---
kind: ResourceQuotaList
items:
- metadata: {name: cores, namespace: ml}
  spec: {hard: {limits.nvidia.com/gpucores: 200}}
)",
                                              "quotas.yaml");
  ASSERT_TRUE(m.ok()) << Message(m.status());
  ASSERT_EQ(m->quotas.size(), 2u);
  EXPECT_EQ(m->quotas[0].meta.ns, "ml");
  EXPECT_EQ(m->quotas[0].hard.Get("limits.nvidia.com/gpumem"), "40000");
  EXPECT_FALSE(m->quotas[0].hard.Contains("requests.cpu"));
  EXPECT_EQ(m->quotas[1].hard.Get("limits.nvidia.com/gpucores"), "200");
  EXPECT_THAT(m->warnings, ::testing::IsEmpty());
}

TEST(LoadManifestsTest, ApiServerPodListAndSingleObjects) {
  // Items of a PodList carry no kind.
  absl::StatusOr<Manifests> m = LoadManifestFile(TestData("podlist.json"));
  ASSERT_TRUE(m.ok()) << Message(m.status());
  EXPECT_EQ(m->pods.size(), 3u);
  m = LoadManifestFile(TestData("node.json"));
  ASSERT_TRUE(m.ok()) << Message(m.status());
  ASSERT_EQ(m->nodes.size(), 1u);
  EXPECT_EQ(m->nodes[0].meta.name, "gpu-node-03");
  m = LoadManifests("kind: Pod\nmetadata: {name: a}\n", "inline");
  ASSERT_TRUE(m.ok()) << Message(m.status());
  EXPECT_EQ(m->pods.at(0).meta.name, "a");
  m = LoadManifests("", "empty");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->pods.empty());
  m = LoadManifests("apiVersion: v1\nitems: []\nkind: List\n", "l");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->warnings.empty());
}

TEST(LoadManifestsTest, ErrorsNameSourceDocumentAndObject) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"kind: Node\nmetadata: {name: n}\n---\nkind: Service\n---\nkind: Pod\nmetadata:\n"
       "  name: x\n  namespace: default\nspec:\n  containers: {name: c}\n",
       "cluster.yaml: document 3 (Pod default/x): spec.containers: expected array"},
      {"kind: List\nitems:\n- kind: Node\n  metadata: {name: gpu-1}\n  status:\n"
       "    allocatable: [1, 2]\n",
       "cluster.yaml: document 1 items[0] (Node gpu-1): status.allocatable: expected object"},
      {"kind: Pod\nspec:\n  containers:\n  - securityContext: {privileged: yes}\n",
       "cluster.yaml: document 1 (Pod): spec.containers[0].securityContext.privileged: "
       "expected boolean"},
      {"kind: Pod\nmetadata: {name: [a]}\n",
       "cluster.yaml: document 1 (Pod): metadata.name: expected string"},
      {"- a\n- b\n", "cluster.yaml: document 1: expected an object"},
      {"kind: List\nitems: {}\n", "cluster.yaml: document 1 (List): items: expected array"},
      {"kind: Pod\nmetadata: {name: \"x\n",
       "cluster.yaml: line 3, column 1: end of map flow not found"},
      {"{\"kind\":\"Pod\",\"spec\":{\"containers\":7}}",
       "cluster.yaml: document 1 (Pod): spec.containers: expected array"},
      {"{\"kind\":\"Pod\"} x", "cluster.yaml: json stream: unexpected byte 0x78"},
      {"{\"kind\":\"Pod\"", "cluster.yaml: document 1: unterminated JSON object"},
      {"{\"kind\":\"Pod\",}", "cluster.yaml: document 1: invalid JSON"},
      // yaml-cpp 0.7 emits this document forever (YAML::LoadAll never returns).
      {"\"\",", "cluster.yaml: document 1: expected an object"},
      {"---\n\"\",", "cluster.yaml: document 1: expected an object"},
      {"kind: Pod\n? [a]\n: b\n",
       "cluster.yaml: document 1: line 2, column 3: mapping key is not a string"},
      {"a: &a [1, 2]\nb: *a\nc: *zz\n", "cluster.yaml: "},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Manifests> m = LoadManifests(c.text, "cluster.yaml");
    ASSERT_FALSE(m.ok()) << c.text;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(m.status()), HasSubstr(c.message)) << c.text;
  }
}

TEST(LoadManifestsTest, AnchorsAndAliases) {
  absl::StatusOr<Manifests> m = LoadManifests(
      "kind: Pod\nmetadata:\n  name: p\n  labels: &l {hami.io/app: x, hami.io/tier: 1}\n"
      "  annotations: *l\n",
      "a.yaml");
  ASSERT_TRUE(m.ok()) << Message(m.status());
  EXPECT_EQ(m->pods.at(0).meta.annotations,
            (StringMap{{"hami.io/app", "x"}, {"hami.io/tier", "1"}}));
  // Nested aliases that would expand exponentially are refused.
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 12; ++i) {
    bomb += fmt::format(
        "a{0}: &a{0} [*a{1}, *a{1}, *a{1}, *a{1}, *a{1}, *a{1}, *a{1}, *a{1}, "
        "*a{1}, *a{1}]\n",
        i, i - 1);
  }
  m = LoadManifests(bomb, "bomb.yaml");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(Message(m.status()), HasSubstr("too many values"));
}

TEST(LoadManifestsTest, MissingFile) {
  absl::StatusOr<Manifests> m = LoadManifestFile("/nonexistent/cluster.yaml");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(m.status()), HasSubstr("/nonexistent/cluster.yaml"));
}

}  // namespace
}  // namespace tessera::kube
