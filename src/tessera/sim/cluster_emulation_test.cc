#include "tessera/sim/cluster_emulation.h"

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/apisim/server.h"
#include "tessera/kube/client.h"
#include "tessera/kube/manifest.h"
#include "tessera/kube/transport.h"

namespace tessera::sim {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kCluster[] = R"(
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: old-node
    labels: {gpu: "on"}
    annotations:
      hami.io/node-nvidia-register: 'GPU-a0,10,7680,100,NVIDIA-Tesla P4,0,true:GPU-a1,10,7680,100,NVIDIA-Tesla P4,0,true:'
      hami.io/node-handshake: Requesting_2026.12.04 10:00:00
      hami.io/mutex.lock: 2026-12-04T10:00:00Z,ml,p
      hami.io/node-scheduler-policy: binpack
- apiVersion: v1
  kind: Node
  metadata:
    name: new-node
    annotations:
      hami.io/node-nvidia-register: '[{"id":"GPU-b0","count":4,"devmem":16384,"devcore":100,"type":"NVIDIA-Tesla T4","health":true}]'
  status:
    allocatable: {nvidia.com/gpu: "7", cpu: "8"}
- apiVersion: v1
  kind: Pod
  metadata:
    name: running
    namespace: ml
    annotations:
      hami.io/vgpu-node: old-node
      hami.io/bind-phase: success
      hami.io/vgpu-devices-allocated: 'GPU-a0,NVIDIA,2000,0:;'
  spec:
    nodeName: old-node
    schedulerName: hami-scheduler
    containers:
    - name: main
      image: cuda:12
      resources:
        limits: {nvidia.com/gpu: "1", nvidia.com/gpumem: "2000"}
  status: {phase: Running}
- apiVersion: v1
  kind: Pod
  metadata:
    name: waiting
    annotations: {hami.io/vgpu-node: new-node, nvidia.com/use-gputype: T4}
  spec:
    containers: [{name: main, image: cuda:12}]
)";

absl::StatusOr<ClusterPlan> Plan(const std::string& text) {
  absl::StatusOr<kube::Manifests> m = kube::LoadManifests(text, "c.yaml");
  if (!m.ok()) {
    return m.status();
  }
  return PlanCluster(*m, "c.yaml");
}

TEST(PlanClusterTest, NodesInTheirFormatsWithCapacity) {
  absl::StatusOr<ClusterPlan> plan = Plan(kCluster);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->nodes.size(), 2u);
  const PlannedNode& old_node = plan->nodes[0];
  EXPECT_EQ(old_node.name, "old-node");
  EXPECT_EQ(old_node.format, device::RegisterFormat::kDelimited);
  ASSERT_EQ(old_node.devices.size(), 2u);
  EXPECT_EQ(old_node.devices[1].id, "GPU-a1");
  EXPECT_EQ(old_node.gpus, 20);  // no allocatable in the file: 2 GPUs × split count 10
  const PlannedNode& new_node = plan->nodes[1];
  EXPECT_EQ(new_node.format, device::RegisterFormat::kJson);
  EXPECT_EQ(new_node.gpus, 7);  // the file's allocatable wins

  // The plugin writes the registration and handshake; the stale lock is dropped with a warning;
  // other annotations and labels are kept, plus the kubelet's hostname label.
  json n = json::parse(old_node.node_json);
  EXPECT_EQ(n["metadata"]["annotations"], json({{"hami.io/node-scheduler-policy", "binpack"}}));
  EXPECT_EQ(n["metadata"]["labels"]["gpu"], "on");
  EXPECT_EQ(n["metadata"]["labels"]["kubernetes.io/hostname"], "old-node");
  EXPECT_FALSE(n.contains("status"));
  ASSERT_EQ(plan->warnings.size(), 1u);
  EXPECT_THAT(plan->warnings[0], HasSubstr("hami.io/mutex.lock dropped"));

  json s = json::parse(NodeStatusJson(new_node, absl::FromUnixSeconds(0)));
  EXPECT_EQ(s["allocatable"]["nvidia.com/gpu"], "7");
  EXPECT_EQ(s["allocatable"]["cpu"], "8");     // the file's
  EXPECT_EQ(s["allocatable"]["pods"], "110");  // a kubelet's default
  EXPECT_EQ(s["capacity"], s["allocatable"]);
  EXPECT_EQ(s["conditions"][0]["type"], "Ready");
  EXPECT_EQ(s["conditions"][0]["status"], "True");
  EXPECT_EQ(s["conditions"][0]["lastHeartbeatTime"], "1970-01-01T00:00:00Z");
}

TEST(PlanClusterTest, PodsKeepWhatTesseraReads) {
  absl::StatusOr<ClusterPlan> plan = Plan(kCluster);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->namespaces, ElementsAre("default", "ml"));
  ASSERT_EQ(plan->pods.size(), 2u);
  const PlannedPod& running = plan->pods[0];
  EXPECT_EQ(running.node, "old-node");
  EXPECT_EQ(running.phase, kube::PodPhase::kRunning);
  json p = json::parse(running.json);
  EXPECT_EQ(p["metadata"]["namespace"], "ml");
  EXPECT_EQ(p["spec"]["nodeName"], "old-node");
  EXPECT_EQ(p["spec"]["schedulerName"], "hami-scheduler");
  // Bound: created as the file has it, past the webhook (its opt-out label).
  EXPECT_EQ(p["metadata"]["annotations"],
            json({{"hami.io/vgpu-node", "old-node"},
                  {"hami.io/bind-phase", "success"},
                  {"hami.io/vgpu-devices-allocated", "GPU-a0,NVIDIA,2000,0:;"}}));
  EXPECT_EQ(p["metadata"]["labels"], json({{"hami.io/webhook", "ignore"}}));
  EXPECT_TRUE(running.scheduler_patch.empty());
  EXPECT_EQ(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"], "2000");
  EXPECT_EQ(p["spec"]["containers"][0]["image"], "registry.k8s.io/pause:3.10");
  EXPECT_FALSE(p.contains("status"));  // the kubelet reports it

  const PlannedPod& waiting = plan->pods[1];
  EXPECT_EQ(waiting.ns, "default");
  EXPECT_TRUE(waiting.node.empty());
  json w = json::parse(waiting.json);
  EXPECT_FALSE(w["spec"].contains("nodeName"));
  // Unbound: through the webhook, so what the scheduler writes comes in a patch after the create.
  EXPECT_FALSE(w["metadata"].contains("labels"));
  EXPECT_EQ(w["metadata"]["annotations"], json({{"nvidia.com/use-gputype", "T4"}}));
  EXPECT_EQ(json::parse(waiting.scheduler_patch),
            json({{"metadata", {{"annotations", {{"hami.io/vgpu-node", "new-node"}}}}}}));
}

// Every error names the file and the object, and comes before any API call.
TEST(PlanClusterTest, BadInputIsAnErrorNamingTheObject) {
  struct Case {
    std::string text, want;
  } cases[] = {
      {"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: m}]}\n",
       "c.yaml: no Node"},
      {"apiVersion: v1\nkind: Node\nmetadata: {name: n}\n",
       "c.yaml: Node n: no hami.io/node-nvidia-register annotation"},
      {"apiVersion: v1\nkind: Node\nmetadata: {name: n, annotations: "
       "{hami.io/node-nvidia-register: 'GPU-x,ten,1,1,T,0,true:'}}\n",
       "c.yaml: Node n: annotation hami.io/node-nvidia-register does not decode"},
      {"apiVersion: v1\nkind: Node\nmetadata: {name: n, annotations: "
       "{hami.io/node-nvidia-register: 'GPU-x,10,7680,100,T,0,true:'}}\n"
       "status: {allocatable: {nvidia.com/gpu: 2.5}}\n",
       "c.yaml: Node n: status.allocatable[nvidia.com/gpu] = \"2.5\" is not a whole number"},
      {"apiVersion: v1\nkind: Node\nmetadata: {name: n, annotations: "
       "{hami.io/node-nvidia-register: 'GPU-x,10,7680,100,T,0,true:'}}\n---\n"
       "apiVersion: v1\nkind: Node\nmetadata: {name: n, annotations: "
       "{hami.io/node-nvidia-register: 'GPU-y,10,7680,100,T,0,true:'}}\n",
       "c.yaml: Node n: a second node of this name"},
      {"apiVersion: v1\nkind: Node\nmetadata: {name: n, annotations: "
       "{hami.io/node-nvidia-register: 'GPU-x,10,7680,100,T,0,true:'}}\n---\n"
       "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {nodeName: elsewhere, "
       "containers: [{name: m}]}\n",
       "c.yaml: Pod default/p: spec.nodeName elsewhere is not a node of the file"},
      {"apiVersion: v1\nkind: Node\nmetadata: {name: n, annotations: "
       "{hami.io/node-nvidia-register: 'GPU-x,10,7680,100,T,0,true:'}}\n---\n"
       "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: m}]}\n---\n"
       "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\n"
       "spec: {containers: [{name: m}]}\n",
       "c.yaml: Pod default/p: a second pod of this name"},
      {"apiVersion: v1\nkind: Node\nmetadata: {name: n, annotations: "
       "{hami.io/node-nvidia-register: 'GPU-x,10,7680,100,T,0,true:'}}\n---\n"
       "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: Bad_NS}\n"
       "spec: {containers: [{name: m}]}\n",
       "c.yaml: Pod Bad_NS/p: metadata.namespace is not a valid namespace name"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClusterPlan> plan = Plan(c.text);
    ASSERT_FALSE(plan.ok()) << c.text;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.want)) << c.text;
  }
}

TEST(PlanClusterTest, AnUnreadableFileIsAnError) {
  absl::StatusOr<ClusterPlan> plan = LoadClusterPlan("/nonexistent/cluster.yaml");
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("/nonexistent/cluster.yaml"));
}

// The plugins and kubelets of a plan (Step) against an in-process apisim: the objects are made
// as Setup would (apisim has no ServiceAccounts, so Setup itself runs in
// test/controlplane/cluster_test.sh on the real API server).
class StepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<apisim::Server>> s = apisim::Server::Start({});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    kube::RestConfig c;
    c.server = server_->url();
    c.qps = 0;
    absl::StatusOr<std::unique_ptr<kube::CurlTransport>> t =
        kube::CurlTransport::Create(c, nullptr);
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    client_ = std::make_unique<kube::ApiClient>(transport_.get());
  }

  // A pod as kube-scheduler and Tessera leave it: bound to `node`, bind-phase allocating.
  void MakeBoundPod(const std::string& name, const std::string& node, bool allocating) {
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", name}, {"namespace", "default"}}},
                {"spec", {{"nodeName", node}, {"containers", {{{"name", "a"}, {"image", "x"}}}}}},
                {"status", {{"phase", "Pending"}}}};  // what a real API server defaults
    if (allocating) {
      const std::string alloc = "GPU-b0,NVIDIA,1000,0:;";
      pod["metadata"]["annotations"] = {{"hami.io/vgpu-node", node},
                                        {"hami.io/vgpu-devices-allocated", alloc},
                                        {"hami.io/vgpu-devices-to-allocate", alloc},
                                        {"hami.io/bind-phase", "allocating"},
                                        {"hami.io/bind-time", "1800000000"}};
    }
    ASSERT_TRUE(CreatePod(*transport_, "default", name, pod.dump()).ok());
  }

  std::vector<kube::Pod> Pods(std::initializer_list<const char*> names) {
    std::vector<kube::Pod> out;
    for (const char* n : names) {
      absl::StatusOr<kube::Pod> p = client_->GetPod("default", n);
      if (p.ok()) {
        out.push_back(*p);
      }
    }
    return out;
  }

  std::unique_ptr<apisim::Server> server_;
  std::unique_ptr<kube::CurlTransport> transport_;
  std::unique_ptr<kube::ApiClient> client_;
};

TEST_F(StepTest, AllocatesStartsEndsAndFinishesDeletions) {
  absl::StatusOr<ClusterPlan> plan = Plan(std::string(kCluster) + R"(
- apiVersion: v1
  kind: Pod
  metadata: {name: done, namespace: default}
  spec: {nodeName: new-node, containers: [{name: a}]}
  status: {phase: Succeeded}
)");
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PlannedNode& n : plan->nodes) {
    ASSERT_TRUE(CreateNode(*transport_, n.node_json).ok());
  }
  MakeBoundPod("gpu", "new-node", true);
  MakeBoundPod("plain", "new-node", false);
  MakeBoundPod("done", "new-node", false);
  MakeBoundPod("elsewhere", "not-emulated", false);
  ClusterEmulation e(*std::move(plan), transport_.get(), client_.get());
  e.Step(Pods({"gpu", "plain", "done", "elsewhere"}), absl::Now());

  absl::StatusOr<kube::Pod> gpu = client_->GetPod("default", "gpu");
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->meta.annotations.Get("hami.io/bind-phase"), "success");
  EXPECT_EQ(gpu->phase, kube::PodPhase::kRunning);
  EXPECT_EQ(client_->GetPod("default", "plain")->phase, kube::PodPhase::kRunning);
  EXPECT_EQ(client_->GetPod("default", "done")->phase, kube::PodPhase::kSucceeded);
  EXPECT_EQ(client_->GetPod("default", "elsewhere")->phase, kube::PodPhase::kPending);
  EmulationCounters c = e.counters();
  EXPECT_EQ(c.allocated, 1);
  EXPECT_EQ(c.started, 3);
  EXPECT_EQ(c.ended, 1);
  EXPECT_EQ(c.errors, 0);

  // A graceful delete: the kubelet stops the pod and removes it.
  ASSERT_TRUE(DeletePod(*transport_, "default", "plain", 30).ok());
  std::vector<kube::Pod> deleting = Pods({"plain"});
  ASSERT_EQ(deleting.size(), 1u);  // kept until its kubelet is done, as on a real API server
  ASSERT_TRUE(deleting[0].Deleting());
  e.Step(deleting, absl::Now());
  EXPECT_TRUE(absl::IsNotFound(client_->GetPod("default", "plain").status()));
  EXPECT_EQ(e.counters().deleted, 1);
}

}  // namespace
}  // namespace tessera::sim
