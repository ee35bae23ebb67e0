// End-to-end tests of `tessera serve` in process: an apisim on port 0, the Service on port 0, and
// kube-scheduler played by an HTTP client posting the extender JSON it sends.
#include "tessera/serve/service.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <fmt/core.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tessera/apisim/server.h"
#include "tessera/base/logging.h"
#include "tessera/kube/decode.h"
#include "tessera/metrics/build_revision.h"
#include "tessera/sim/synthetic.h"
#include "tessera/testing/serve_env.h"
#include "tessera/testing/wait.h"

namespace tessera::serve {
namespace {

using ::tessera::testing::Eventually;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

std::vector<std::string> Split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    if (end > start) {
      parts.emplace_back(text.substr(start, end - start));
    }
    start = end + 1;
  }
  return parts;
}

bool HasPrefix(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

const apisim::ResourceInfo& Res(const char* name) { return *apisim::FindResource("", "v1", name); }

// The Lease kube-system/hami-scheduler as a kube-scheduler writes it: `holder`, renewed now.
std::string KubeSchedulerLease(const std::string& holder) {
  const std::string now =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone());
  return nlohmann::json{{"apiVersion", "coordination.k8s.io/v1"},
                        {"kind", "Lease"},
                        {"metadata", {{"name", "hami-scheduler"}, {"namespace", "kube-system"}}},
                        {"spec",
                         {{"holderIdentity", holder},
                          {"leaseDurationSeconds", 15},
                          {"acquireTime", now},
                          {"renewTime", now}}}}
      .dump();
}

// A JSON registration of `gpus` GPUs of `mem` MiB, with UUIDs GPU-<node>-<i>.
std::string JsonRegister(const std::string& node, int gpus, int mem, int numa_split = 0) {
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < gpus; ++i) {
    devices.push_back({{"id", "GPU-" + node + "-" + std::to_string(i)},
                       {"index", i},
                       {"count", 10},
                       {"devmem", mem},
                       {"devcore", 100},
                       {"type", i % 2 == 0 ? "NVIDIA-A100" : "NVIDIA-T4"},
                       {"numa", numa_split > 0 && i >= numa_split ? 1 : 0},
                       {"health", true}});
  }
  return devices.dump();
}

std::string NodeJson(const std::string& name, const std::string& register_value,
                     const std::string& handshake = "") {
  nlohmann::json annotations = {{"hami.io/node-nvidia-register", register_value}};
  if (!handshake.empty()) {
    annotations["hami.io/node-handshake"] = handshake;
  }
  nlohmann::json node = {{"apiVersion", "v1"},
                         {"kind", "Node"},
                         {"metadata", {{"name", name}, {"annotations", annotations}}},
                         {"status",
                          {{"allocatable", {{"nvidia.com/gpu", "20"}}},
                           {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
  return node.dump();
}

struct ContainerSpec {
  int gpus = 1;
  int mem = 0;      // MiB; 0 = not set
  int percent = 0;  // nvidia.com/gpumem-percentage; 0 = not set
  int cores = 0;
};

std::string PodJson(const std::string& name, const std::vector<ContainerSpec>& containers,
                    const nlohmann::json& annotations = nlohmann::json::object()) {
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < containers.size(); ++i) {
    nlohmann::json limits = {{"nvidia.com/gpu", std::to_string(containers[i].gpus)}};
    if (containers[i].mem > 0) {
      limits["nvidia.com/gpumem"] = std::to_string(containers[i].mem);
    }
    if (containers[i].percent > 0) {
      limits["nvidia.com/gpumem-percentage"] = std::to_string(containers[i].percent);
    }
    if (containers[i].cores > 0) {
      limits["nvidia.com/gpucores"] = std::to_string(containers[i].cores);
    }
    list.push_back({{"name", "c" + std::to_string(i)},
                    {"image", "cuda"},
                    {"resources", {{"limits", limits}}}});
  }
  nlohmann::json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", annotations}}},
      {"spec", {{"schedulerName", "hami-scheduler"}, {"containers", list}}}};
  return pod.dump();
}

class ServeTest : public ::tessera::testing::ServeFixture {
 protected:
  // A replica on host `host` following the kube-scheduler Lease kube-system/hami-scheduler
  // (the defaults), read every 100 ms; not waited for.
  std::unique_ptr<Service> StartFollowing(const std::string& host,
                                          std::function<void(ServeOptions&)> adjust = nullptr) {
    ServeOptions o = TestOptions();
    o.leader.identity = host;
    o.leader.retry_period = absl::Milliseconds(100);
    if (adjust) {
      adjust(o);
    }
    return StartReplica(o);
  }

  // A kube-scheduler on `holder`'s host takes (or renews) the Lease kube-system/hami-scheduler.
  void SetLeaseHolder(const std::string& holder) {
    const apisim::ResourceInfo& leases =
        *apisim::FindResource("coordination.k8s.io", "v1", "leases");
    const std::string json = KubeSchedulerLease(holder);
    absl::Status status =
        store().Get(leases, "kube-system", "hami-scheduler").ok()
            ? store().Update(leases, "kube-system", "hami-scheduler", "", json).status()
            : store().Create(leases, "kube-system", json).status();
    ASSERT_TRUE(status.ok()) << status;
  }

  nlohmann::json Bind(const kube::Pod& pod, const std::string& node) {
    EXPECT_EQ(pod.meta.ns, "default");
    return ServeFixture::Bind(pod.meta.name, pod.meta.uid, node);
  }

  // The value of the sample of `family` whose label set contains every `labels` pair, from
  // /metrics; NaN when absent.
  double Metric(const std::string& family, const std::vector<std::string>& labels) {
    auto res = GetMetricsPort("/metrics");
    if (!res || res->status != 200) {
      ADD_FAILURE() << "no /metrics";
      return -1;
    }
    for (const std::string& line : Split(res->body, '\n')) {
      if (!HasPrefix(line, family + "{") && !HasPrefix(line, family + " ")) {
        continue;
      }
      bool all = true;
      for (const std::string& l : labels) {
        all = all && line.find(l) != std::string::npos;
      }
      if (all) {
        return std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return std::nan("");
  }

  // Node "a" with one 8000 MiB card shared by two running pods of priority 10 holding 4000 MiB
  // each, "low-old" and "low-young" (started an hour later; labelled app=<name>; a grace period
  // of 1 s): the preemption tests' cluster.
  void AddTwoLowPods() {
    AddNode(NodeJson("a", JsonRegister("a", 1, 8000)));
    for (const auto& [name, started] : {std::pair{"low-old", "2026-12-07T10:00:00Z"},
                                        std::pair{"low-young", "2026-12-07T11:00:00Z"}}) {
      nlohmann::json low = nlohmann::json::parse(PodJson(name, {{.gpus = 1, .mem = 4000}}));
      low["metadata"]["annotations"] = {
          {"hami.io/vgpu-node", "a"},
          {"hami.io/vgpu-devices-allocated", "GPU-a-0,NVIDIA,4000,0:;"},
          {"hami.io/bind-phase", "success"}};
      low["metadata"]["labels"] = {{"app", name}};
      low["spec"]["nodeName"] = "a";
      low["spec"]["priority"] = 10;
      low["spec"]["terminationGracePeriodSeconds"] = 1;
      low["status"] = {{"phase", "Running"}, {"startTime", started}};
      AddPod(low.dump());
    }
  }

  // The node a pod was filtered to ("" when none), with the reply.
  // ResourceQuota default/gpu limiting limits.nvidia.com/gpumem to `mib`.
  void AddGpuMemQuota(int mib) {
    const nlohmann::json quota = {
        {"apiVersion", "v1"},
        {"kind", "ResourceQuota"},
        {"metadata", {{"name", "gpu"}, {"namespace", "default"}}},
        {"spec", {{"hard", {{"limits.nvidia.com/gpumem", std::to_string(mib)}}}}}};
    ASSERT_TRUE(store().Create(Res("resourcequotas"), "default", quota.dump()).ok());
  }

  // The pod's annotation `key` as the API server stores it ("" when absent).
  std::string StoredAnnotation(const std::string& name, const std::string& key) {
    absl::StatusOr<std::string> raw = store().Get(Res("pods"), "default", name);
    const nlohmann::json pod = nlohmann::json::parse(raw.ok() ? *raw : "{}");
    return pod.value("/metadata/annotations"_json_pointer, nlohmann::json::object()).value(key, "");
  }

  // Filters pod `name` (created from `containers` and `annotations`, or with !create the one
  // stored) over `nodes`; the chosen node, or "" when none.
  std::string FilterTo(const std::string& name, const std::vector<ContainerSpec>& containers,
                       const std::vector<std::string>& nodes,
                       const nlohmann::json& annotations = nlohmann::json::object(),
                       bool create = true) {
    const std::string json = create ? AddPod(PodJson(name, containers, annotations))
                                    : store().Get(Res("pods"), "default", name).value_or("{}");
    nlohmann::json reply = Filter(json, nodes);
    EXPECT_EQ(reply.value("Error", "x"), "") << reply.dump();
    if (!reply.contains("NodeNames") || !reply["NodeNames"].is_array() ||
        reply["NodeNames"].size() != 1) {
      return "";
    }
    return reply["NodeNames"][0];
  }

  // Sends `request` on a fresh connection to the extender and returns what arrives first.
  std::string RawRequest(const std::string& request) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(service()->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      timeval tv{5, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      char buf[512];
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        reply.assign(buf, static_cast<size_t>(n));
      }
    }
    close(fd);
    return reply;
  }
};

TEST_F(ServeTest, FilterWritesHamiAnnotationsAndBindBindsAndTheMetricsFollow) {
  AddNode(NodeJson("a", JsonRegister("a", 2, 16000)));
  AddNode(NodeJson("b", JsonRegister("b", 2, 16000)));
  StartService();
  auto ready = client()->Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);

  const std::string pod_json = AddPod(PodJson("train", {{.gpus = 1, .mem = 4000, .cores = 30}}));
  nlohmann::json reply = Filter(pod_json, {"a", "b"});
  ASSERT_TRUE(reply["NodeNames"].is_array()) << reply.dump();
  ASSERT_EQ(reply["NodeNames"].size(), 1u) << reply.dump();
  const std::string node = reply["NodeNames"][0];
  EXPECT_EQ(reply["Error"], "");

  kube::Pod pod = GetPod("train");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-node"), node);
  EXPECT_EQ(pod.meta.labels.Get("hami.io/vgpu-node"), node);
  const std::string allocated(pod.meta.annotations.Get("hami.io/vgpu-devices-allocated"));
  EXPECT_THAT(allocated, StartsWith("GPU-" + node + "-"));
  EXPECT_THAT(allocated, HasSubstr(",NVIDIA,4000,30:;"));
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-devices-to-allocate"), allocated);
  EXPECT_FALSE(pod.meta.annotations.Get("hami.io/vgpu-time").empty());

  // The reservation already counts (the pod is not bound yet).
  const std::string uuid = allocated.substr(0, allocated.find(','));
  EXPECT_EQ(Metric("hami_gpu_memory_allocated_bytes", {"device_uuid=\"" + uuid + "\""}),
            4000.0 * 1048576);

  nlohmann::json bound = Bind(pod, node);
  EXPECT_EQ(bound["Error"], "") << bound.dump();
  pod = GetPod("train");
  EXPECT_EQ(pod.node_name, node);
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/bind-phase"), "allocating");
  EXPECT_THAT(std::string(GetNode(node).meta.annotations.Get("hami.io/mutex.lock")),
              HasSubstr(",default,train"));

  // Once the informer sees the pod bound, the record holds instead of the reservation.
  EXPECT_TRUE(Eventually([&] {
    nlohmann::json debug = nlohmann::json::parse(service()->DebugLedgerJson());
    return debug["reservations"].empty() && debug["records"] == 1;
  })) << service()->DebugLedgerJson();
  EXPECT_EQ(Metric("hami_gpu_memory_allocated_bytes", {"device_uuid=\"" + uuid + "\""}),
            4000.0 * 1048576);
  EXPECT_EQ(Metric("hami_vgpu_memory_allocated_bytes", {"pod=\"train\""}), 4000.0 * 1048576);

  // /debug/ledger (on the metrics listener) says which pod is on the GPU.
  auto debug = GetMetricsPort("/debug/ledger");
  ASSERT_TRUE(debug);
  EXPECT_EQ(debug->status, 200);
  EXPECT_THAT(debug->body, HasSubstr("\"train\""));

  // Deleting the pod frees the device.
  ASSERT_TRUE(store().Delete(Res("pods"), "default", "train", R"({"gracePeriodSeconds":0})").ok());
  EXPECT_TRUE(Eventually([&] {
    return Metric("hami_gpu_memory_allocated_bytes", {"device_uuid=\"" + uuid + "\""}) == 0;
  }));
}

// The preempt verb end to end: one 8000 MiB card shared by two bound low-priority pods of 4000,
// a pod of priority 1000 asking 4000 offered the node as Kubernetes 1.38 offers it (no victim of
// kube-scheduler's own): exactly one of the two is named.
TEST_F(ServeTest, PreemptNamesTheOneVictimTheDeviceShareNeeds) {
  AddTwoLowPods();
  StartService();
  ASSERT_TRUE(Eventually([&] {
    return nlohmann::json::parse(service()->DebugLedgerJson())["records"] == 2;
  })) << service()->DebugLedgerJson();

  nlohmann::json high = nlohmann::json::parse(PodJson("high", {{.gpus = 1, .mem = 4000}}));
  high["spec"]["priority"] = 1000;
  const std::string high_json = AddPod(high.dump());
  EXPECT_EQ(FilterTo("high", {}, {"a"}, nlohmann::json::object(), false), "");

  auto preempt = [&](const std::string& victims) {
    return client()->Post("/preempt",
                          R"({"Pod":)" + high_json + R"(,"NodeNameToMetaVictims":)" + victims + "}",
                          "application/json");
  };
  auto res = preempt(R"({"a":{"Pods":[],"NumPDBViolations":0}})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const nlohmann::json reply = nlohmann::json::parse(res->body);
  ASSERT_EQ(reply["NodeNameToMetaVictims"].size(), 1u) << res->body;
  const nlohmann::json& pods = reply["NodeNameToMetaVictims"]["a"]["Pods"];
  ASSERT_EQ(pods.size(), 1u) << res->body;
  EXPECT_EQ(pods[0]["UID"], GetPod("low-young").meta.uid) << "the least work lost";
  EXPECT_EQ(reply["NodeNameToMetaVictims"]["a"]["NumPDBViolations"], 0);

  // A PodDisruptionBudget that allows no disruption of low-young: the older pod goes instead.
  const nlohmann::json pdb = {
      {"apiVersion", "policy/v1"},
      {"kind", "PodDisruptionBudget"},
      {"metadata", {{"name", "young"}, {"namespace", "default"}}},
      {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", "low-young"}}}}}}},
      {"status", {{"disruptionsAllowed", 0}}}};
  ASSERT_TRUE(store()
                  .Create(*apisim::FindResource("policy", "v1", "poddisruptionbudgets"), "default",
                          pdb.dump())
                  .ok());
  res = preempt(R"({"a":{"Pods":[],"NumPDBViolations":0}})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const nlohmann::json guarded = nlohmann::json::parse(res->body)["NodeNameToMetaVictims"]["a"];
  ASSERT_EQ(guarded["Pods"].size(), 1u) << res->body;
  EXPECT_EQ(guarded["Pods"][0]["UID"], GetPod("low-old").meta.uid);
  EXPECT_EQ(guarded["NumPDBViolations"], 0);

  // A body naming a pod the informer does not hold gets its answer but no event: nothing vouches
  // for that pod. (Sent before the ghost's call: events go out in order, so once the ghost's
  // event is stored, one about "forged" would be too.)
  nlohmann::json forged = nlohmann::json::parse(high_json);
  forged["metadata"]["name"] = "forged";
  forged["metadata"]["uid"] = "not-a-pod";
  res = client()->Post("/preempt",
                       R"({"Pod":)" + forged.dump() +
                           R"(,"NodeNameToMetaVictims":{"a":{"Pods":[],"NumPDBViolations":0}}})",
                       "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;

  // A node the ledger does not know is left out; a malformed body is a 400.
  res = preempt(R"({"ghost":null})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, R"({"NodeNameToMetaVictims":{}})");
  // The pod's next refusal carries the answer in its verdict.
  EXPECT_EQ(FilterTo("high", {}, {"a"}, nlohmann::json::object(), false), "");
  EXPECT_TRUE(Eventually([&] {
    return StoredAnnotation("high", "tessera.io/verdict")
               .find(R"("preemption":"no eviction of lower-priority pods frees a GPU share on )"
                     R"(1 node")") != std::string::npos;
  })) << StoredAnnotation("high", "tessera.io/verdict");
  res = preempt(R"({"a":{"Pods":[{"UID":""}]}})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);

  // The pod's owner sees both answers as events.
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<std::string> events = store().List(Res("events"), "default", {});
    const std::string text = events.value_or("");
    return text.find("PreemptionVictimsProposed") != std::string::npos &&
           text.find("to free a GPU share, Tessera proposes evicting: a=[default/low-young]") !=
               std::string::npos &&
           text.find("PreemptionNotHelpful") != std::string::npos &&
           text.find("frees a GPU share for this pod on (ghost)") != std::string::npos;
  }));
  EXPECT_EQ(store().List(Res("events"), "default", {}).value_or("").find("forged"),
            std::string::npos);

  // Three answers named a victim each (the forged body's too), one kept no node; the 400 never
  // reached the preemptor.
  EXPECT_EQ(Metric("tessera_preempt_total", {"outcome=\"victims\""}), 3);
  EXPECT_EQ(Metric("tessera_preempt_total", {"outcome=\"no_node\""}), 1);
  EXPECT_EQ(Metric("tessera_preempt_total", {"outcome=\"error\""}), 0);
  EXPECT_EQ(Metric("tessera_preempt_victims_total", {}), 3);

  // kube-scheduler evicts the victim of the last answer that kept the node (low-old, the budget
  // spares low-young): the share it frees is held for the preemptor.
  ASSERT_TRUE(
      store().Delete(Res("pods"), "default", "low-old", R"({"gracePeriodSeconds":0})").ok());
  EXPECT_TRUE(Eventually([&] {
    const nlohmann::json ledger = nlohmann::json::parse(service()->DebugLedgerJson());
    return ledger["reservations"].size() == 1 &&
           ledger["reservations"][0].dump().find("\"high\"") != std::string::npos;
  })) << service()->DebugLedgerJson();
  EXPECT_EQ(FilterTo("small", {{.gpus = 1, .mem = 2000}}, {"a"}), "")
      << "a smaller pod took the preemptor's share";
}

// --preemption=self end to end (clusters before Kubernetes 1.38, whose kube-scheduler never
// asks): the refusal settles, Tessera evicts the younger low pod through the Eviction API, and
// once it is gone the share is held for the preemptor — a smaller pod is refused it, the
// preemptor gets it. With --preemption=off the verb answers 404.
TEST_F(ServeTest, SelfPreemptionEvictsOneVictimAndHoldsItsShareForThePreemptor) {
  AddTwoLowPods();
  StartService([](ServeOptions& o) {
    o.preemption = PreemptionMode::kSelf;
    o.self_preempt.settle = absl::Milliseconds(300);
    o.self_preempt_period = absl::Milliseconds(50);
  });
  ASSERT_TRUE(Eventually([&] {
    return nlohmann::json::parse(service()->DebugLedgerJson())["records"] == 2;
  })) << service()->DebugLedgerJson();

  nlohmann::json high = nlohmann::json::parse(PodJson("high", {{.gpus = 1, .mem = 4000}}));
  high["spec"]["priority"] = 1000;
  AddPod(high.dump());
  EXPECT_EQ(FilterTo("high", {}, {"a"}, nlohmann::json::object(), false), "");
  ASSERT_TRUE(Eventually([&] { return GetPod("low-young").Deleting(); }, absl::Seconds(10)))
      << "the younger low pod was never evicted";
  EXPECT_FALSE(GetPod("low-old").Deleting());
  // The victim goes (the built-in kubelet ends it after its grace); its share is held at once.
  ASSERT_TRUE(Eventually(
      [&] {
        const nlohmann::json ledger = nlohmann::json::parse(service()->DebugLedgerJson());
        return ledger["records"] == 1 && ledger["reservations"].size() == 1;
      },
      absl::Seconds(10)))
      << service()->DebugLedgerJson();
  EXPECT_EQ(FilterTo("small", {{.gpus = 1, .mem = 2000}}, {"a"}), "")
      << "a smaller pod took the preemptor's share";
  EXPECT_EQ(FilterTo("high", {}, {"a"}, nlohmann::json::object(), false), "a");
  EXPECT_EQ(Metric("tessera_preempt_evictions_total", {"outcome=\"evicted\""}), 1);
  EXPECT_EQ(Metric("tessera_preempt_evictions_total", {"outcome=\"refused\""}), 0);
  EXPECT_TRUE(Eventually([&] {
    const std::string text = store().List(Res("events"), "default", {}).value_or("");
    return text.find("Tessera evicted this pod to free a GPU share on a for default/high") !=
               std::string::npos &&
           text.find("PreemptionShareReserved") != std::string::npos;
  }));
}

TEST_F(ServeTest, PreemptionOffAnswersThePreemptVerbWith404) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 8000)));
  StartService([](ServeOptions& o) { o.preemption = PreemptionMode::kOff; });
  const std::string pod = AddPod(PodJson("high", {{.gpus = 1, .mem = 4000}}));
  auto res = client()->Post("/preempt",
                            R"({"Pod":)" + pod + R"(,"NodeNameToMetaVictims":{"a":{"Pods":[]}}})",
                            "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404) << res->body;
  EXPECT_NE(res->body.find("--preemption=off"), std::string::npos) << res->body;
}

// The NUMA refit end to end over HTTP (HAMi refs/pull/2731 pkg/scheduler/routes/route.go:
// NumaRefit and numa_refit_handler.go:RefitNumaAllocation): a filtered and bound pod whose
// device plugin finds kubelet restricted to the other GPU asks /refit; both annotations, the
// ledger (and so the metrics) and the pod's events follow.
TEST_F(ServeTest, RefitMovesABoundPodsContainerAndTheMetricsFollow) {
  AddNode(NodeJson("a", JsonRegister("a", 2, 16000)));
  StartService([](ServeOptions& o) { o.leader.mode = LeaderMode::kNone; });
  const std::string pod_json = AddPod(PodJson("train", {{.gpus = 1, .mem = 4000, .cores = 30}}));
  nlohmann::json reply = Filter(pod_json, {"a"});
  ASSERT_EQ(reply["NodeNames"], nlohmann::json::array({"a"})) << reply.dump();
  kube::Pod pod = GetPod("train");
  ASSERT_EQ(Bind(pod, "a")["Error"], "");
  const std::string allocated(pod.meta.annotations.Get("hami.io/vgpu-devices-allocated"));
  const std::string from = allocated.substr(0, allocated.find(','));
  const std::string to = from == "GPU-a-0" ? "GPU-a-1" : "GPU-a-0";
  ASSERT_TRUE(Eventually(
      [&] { return nlohmann::json::parse(service()->DebugLedgerJson())["records"] == 1; }));

  const nlohmann::json request = {{"podUID", pod.meta.uid}, {"podNamespace", "default"},
                                  {"podName", "train"},     {"nodeName", "a"},
                                  {"containerIndex", 0},    {"containerName", "c0"},
                                  {"deviceType", "NVIDIA"}, {"allowedDeviceUUIDs", {to}}};
  auto res = client()->Post("/refit", request.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, R"({"succeeded":true,"containerDevices":")" + to + R"(,NVIDIA,4000,30:"})");
  pod = GetPod("train");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-devices-allocated"), to + ",NVIDIA,4000,30:;");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-devices-to-allocate"), to + ",NVIDIA,4000,30:;");
  // The ledger moved with the patch; the informer's delivery of it changes nothing more, nor
  // does its delivery of the bind when that comes after the refit (ledger_pin_test).
  EXPECT_TRUE(Eventually([&] {
    return Metric("hami_gpu_memory_allocated_bytes", {"device_uuid=\"" + to + "\""}) ==
               4000.0 * 1048576 &&
           Metric("hami_gpu_memory_allocated_bytes", {"device_uuid=\"" + from + "\""}) == 0;
  })) << service()->DebugLedgerJson();
  const nlohmann::json audit = nlohmann::json::parse(service()->DebugLedgerJson());
  EXPECT_EQ(audit["records"], 1) << audit.dump();
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<std::string> events =
        store().List(*apisim::FindResource("", "v1", "events"), "default", {});
    return events.ok() && events->find("NUMA refit moved container 0 from [" + from + "] to [" +
                                       to + "]") != std::string::npos;
  }));

  // Refused in band: the pod's container is already on `to`; an unknown pod.
  res = client()->Post("/refit", request.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, R"({"succeeded":true,"containerDevices":")" + to + R"(,NVIDIA,4000,30:"})");
  nlohmann::json unknown = request;
  unknown["podUID"] = "no-such-uid";
  res = client()->Post("/refit", unknown.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(
      res->body,
      R"({"succeeded":false,"failureReason":"pod no-such-uid is not tracked by the scheduler"})");
}

// Only the leader refits: a follower answers in band and changes nothing.
TEST_F(ServeTest, AFollowerRefusesTheRefit) {
  AddNode(NodeJson("a", JsonRegister("a", 2, 16000)));
  SetLeaseHolder("host-b_1f2e");
  std::unique_ptr<Service> follower = StartFollowing("host-a");
  ASSERT_NE(follower, nullptr);
  ASSERT_TRUE(follower->WaitForSync(absl::Seconds(20)));
  ASSERT_FALSE(follower->IsLeader());
  httplib::Client c("127.0.0.1", follower->port());
  const nlohmann::json request = {{"podUID", "u"},          {"podNamespace", "default"},
                                  {"podName", "p"},         {"nodeName", "a"},
                                  {"deviceType", "NVIDIA"}, {"allowedDeviceUUIDs", {"GPU-a-1"}}};
  auto res = c.Post("/refit", request.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const nlohmann::json reply = nlohmann::json::parse(res->body);
  EXPECT_EQ(reply["succeeded"], false);
  EXPECT_THAT(reply["failureReason"].get<std::string>(),
              StartsWith("this replica is not the leader"));
  follower->Stop();
}

// The node informer and the bind wired to the filter's busy nodes (extender/busy_nodes.h):
// under binpack the next pod avoids the node whose lock the last pod's bind holds, until the
// device plugin releases it; then binpack's fuller node wins again.
TEST_F(ServeTest, AFilterAvoidsTheNodeWhoseLockABindHoldsUntilTheDevicePluginReleasesIt) {
  AddNode(NodeJson("a", JsonRegister("a", 2, 16000)));
  AddNode(NodeJson("b", JsonRegister("b", 2, 16000)));
  StartService();
  const std::vector<std::string> both = {"a", "b"};
  ASSERT_EQ(FilterTo("p1", {{.gpus = 1, .mem = 2000}}, both), "a");  // tie: name order
  ASSERT_EQ(Bind(GetPod("p1"), "a").value("Error", "x"), "");
  ASSERT_THAT(std::string(GetNode("a").meta.annotations.Get("hami.io/mutex.lock")),
              EndsWith(",default,p1"));
  const std::string p2 = AddPod(PodJson("p2", {{.gpus = 1, .mem = 2000}}));
  EXPECT_EQ(Filter(p2, both)["NodeNames"][0], "b") << "a's lock is p1's";
  // The device plugin's Allocate releases the lock (the register annotation stays).
  ASSERT_TRUE(
      store().Update(Res("nodes"), "", "a", "", NodeJson("a", JsonRegister("a", 2, 16000))).ok());
  EXPECT_TRUE(Eventually([&] { return Filter(p2, both)["NodeNames"][0] == "a"; }))
      << "a, fuller with p1, is free again";
}

TEST_F(ServeTest, TheFourPolicyCombinations) {
  // Node a already runs a pod on its GPU 0; node b is empty.
  AddNode(NodeJson("a", JsonRegister("a", 2, 16000)));
  AddNode(NodeJson("b", JsonRegister("b", 2, 16000)));
  nlohmann::json busy = nlohmann::json::parse(PodJson("busy", {{.gpus = 1, .mem = 8000}}));
  busy["metadata"]["annotations"] = {{"hami.io/vgpu-node", "a"},
                                     {"hami.io/vgpu-devices-allocated", "GPU-a-0,NVIDIA,8000,0:;"},
                                     {"hami.io/bind-phase", "success"}};
  busy["spec"]["nodeName"] = "a";
  busy["status"] = {{"phase", "Running"}};
  AddPod(busy.dump());
  StartService();
  ASSERT_TRUE(Eventually(
      [&] { return nlohmann::json::parse(service()->DebugLedgerJson())["records"] == 1; }));

  struct Case {
    const char* node_policy;
    const char* gpu_policy;
    const char* want_prefix;  // the allocated UUID
  };
  const Case cases[] = {
      {"binpack", "binpack", "GPU-a-0,"},
      {"binpack", "spread", "GPU-a-1,"},
      {"spread", "binpack", "GPU-b-"},
      {"spread", "spread", "GPU-b-"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string name = "p" + std::to_string(i++);
    const std::string node = FilterTo(name, {{.gpus = 1, .mem = 2000}}, {"a", "b"},
                                      {{"hami.io/node-scheduler-policy", c.node_policy},
                                       {"hami.io/gpu-scheduler-policy", c.gpu_policy}});
    EXPECT_EQ(node, std::string(c.want_prefix).substr(4, 1))
        << c.node_policy << "/" << c.gpu_policy;
    EXPECT_THAT(std::string(GetPod(name).meta.annotations.Get("hami.io/vgpu-devices-allocated")),
                StartsWith(c.want_prefix))
        << c.node_policy << "/" << c.gpu_policy;
    // Release the reservation again so every case starts from the same usage.
    ASSERT_TRUE(store().Delete(Res("pods"), "default", name, R"({"gracePeriodSeconds":0})").ok());
    ASSERT_TRUE(Eventually([&] {
      return nlohmann::json::parse(service()->DebugLedgerJson())["reservations"].empty();
    }));
  }
}

TEST_F(ServeTest, MultiContainerMultiGpuNumaPercentageAndTypeFilters) {
  AddNode(NodeJson("a", JsonRegister("a", 4, 10000, /*numa_split=*/2)));
  AddNode(NodeJson("x", JsonRegister("x", 1, 10000)));
  StartService();
  // Two containers, the second with two GPUs: one entry per container.
  ASSERT_EQ(FilterTo("multi", {{.gpus = 1, .mem = 1000}, {.gpus = 2, .mem = 3000}}, {"a"}), "a");
  std::vector<std::string> containers =
      Split(GetPod("multi").meta.annotations.Get("hami.io/vgpu-devices-allocated"), ';');
  ASSERT_EQ(containers.size(), 2u);
  EXPECT_EQ(std::count(containers[1].begin(), containers[1].end(), ':'), 2);

  // Percentage memory: 50 % of a 10000 MiB card is 5000 MiB.
  ASSERT_EQ(FilterTo("half", {{.gpus = 1, .percent = 50}}, {"a"}), "a");
  EXPECT_THAT(std::string(GetPod("half").meta.annotations.Get("hami.io/vgpu-devices-allocated")),
              HasSubstr(",NVIDIA,5000,"));

  // NUMA binding: both GPUs of the container on one NUMA node (0-1 or 2-3).
  ASSERT_EQ(FilterTo("numa", {{.gpus = 2, .mem = 1000}}, {"a"}, {{"nvidia.com/numa-bind", "true"}}),
            "a");
  const std::string numa(GetPod("numa").meta.annotations.Get("hami.io/vgpu-devices-allocated"));
  const bool low =
      numa.find("GPU-a-0,") != std::string::npos && numa.find("GPU-a-1,") != std::string::npos;
  const bool high =
      numa.find("GPU-a-2,") != std::string::npos && numa.find("GPU-a-3,") != std::string::npos;
  EXPECT_TRUE(low || high) << numa;

  // Type and UUID filters: only T4 (odd indices), never GPU-a-1.
  ASSERT_EQ(FilterTo("t4", {{.gpus = 1, .mem = 1000}}, {"a"},
                     {{"nvidia.com/use-gputype", "T4"}, {"nvidia.com/nouse-gpuuuid", "GPU-a-1"}}),
            "a");
  EXPECT_THAT(std::string(GetPod("t4").meta.annotations.Get("hami.io/vgpu-devices-allocated")),
              StartsWith("GPU-a-3,"));

  // Exclusive use (100 % of the cores) and a request that cannot fit anywhere.
  ASSERT_EQ(FilterTo("exclusive", {{.gpus = 1, .mem = 1000, .cores = 100}}, {"x"}), "x");
  const std::string json = AddPod(PodJson("second", {{.gpus = 1, .mem = 1000}}));
  nlohmann::json reply = Filter(json, {"x", "ghost"});
  EXPECT_TRUE(reply["NodeNames"].empty()) << reply.dump();
  EXPECT_EQ(reply["FailedNodes"]["ghost"], "node unregistered");
  EXPECT_THAT(std::string(reply["FailedNodes"]["x"]), StartsWith("1/1 ")) << reply.dump();
}

TEST_F(ServeTest, DelimitedNodeGetsTheHandshakeAndItsPodsTheOldLayout) {
  AddNode(NodeJson("old", "GPU-old-0,10,16000,100,NVIDIA-Tesla T4,0,true:", "Reported 2026"));
  StartService();
  // The v2.5–v2.7 plugin's handshake: Tessera answers Requesting_<time>.
  EXPECT_TRUE(Eventually([&] {
    return HasPrefix(GetNode("old").meta.annotations.Get("hami.io/node-handshake"), "Requesting_");
  })) << GetNode("old").meta.annotations.Get("hami.io/node-handshake");
  ASSERT_EQ(FilterTo("legacy", {{.gpus = 1, .mem = 2000}}, {"old"}), "old");
  EXPECT_EQ(GetPod("legacy").meta.annotations.Get("hami.io/vgpu-devices-allocated"),
            "GPU-old-0,NVIDIA,2000,0:;");
}

// Two replicas with their own Lease (--leader-elect-mode=lease) against one API server: only
// the leader writes handshakes, both are ready and say which role they have, and when the
// leader stops the other takes over within the lease duration and writes the next handshake.
TEST_F(ServeTest, OnlyTheLeaderWritesHandshakesAndAFollowerTakesOver) {
  AddNode(NodeJson("old", "GPU-old-0,10,16000,100,NVIDIA-Tesla T4,0,true:", "Reported 1"));
  auto start = [&](const std::string& identity) -> std::unique_ptr<Service> {
    ServeOptions o = TestOptions();
    o.leader.mode = LeaderMode::kLease;
    o.leader.ns = "kube-system";
    o.leader.name = "hami-scheduler-tessera";
    o.leader.identity = identity;
    o.leader.lease_duration = absl::Seconds(1);
    o.leader.renew_deadline = absl::Milliseconds(600);
    o.leader.retry_period = absl::Milliseconds(200);
    std::unique_ptr<Service> service = StartReplica(o);
    if (service != nullptr) {
      EXPECT_TRUE(service->WaitForSync(absl::Seconds(20)));
    }
    return service;
  };
  auto writes = [](Service& s) {
    return nlohmann::json::parse(s.DebugLedgerJson())["leadership"]["handshake_writes"]
        .get<uint64_t>();
  };
  auto readyz = [](Service& s) {
    httplib::Client c("127.0.0.1", s.port());
    auto res = c.Get("/readyz");
    return res ? std::to_string(res->status) + " " + res->body : std::string("no response");
  };
  auto handshake = [&]() -> std::string {
    return std::string(GetNode("old").meta.annotations.Get("hami.io/node-handshake"));
  };
  // The v2.5 device plugin reports again (a new Reported value): the leader answers it.
  auto report = [&](const std::string& n) {
    ASSERT_TRUE(store()
                    .Update(Res("nodes"), "", "old", "",
                            NodeJson("old", "GPU-old-0,10,16000,100,NVIDIA-Tesla T4,0,true:",
                                     "Reported " + n))
                    .ok());
  };

  std::unique_ptr<Service> a = start("replica-a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->IsLeader()) << a->LeaderDescription();  // the first round ran in Start
  std::unique_ptr<Service> b = start("replica-b");
  ASSERT_NE(b, nullptr);
  EXPECT_FALSE(b->IsLeader()) << b->LeaderDescription();

  ASSERT_TRUE(Eventually([&] { return HasPrefix(handshake(), "Requesting_"); })) << handshake();
  report("2");
  ASSERT_TRUE(Eventually([&] { return HasPrefix(handshake(), "Requesting_"); })) << handshake();
  // (The counter moves when the PATCH's reply arrives, just after the store changed.)
  EXPECT_TRUE(Eventually([&] { return writes(*a) >= 2; })) << writes(*a);
  EXPECT_EQ(writes(*b), 0u);
  // Both ready (informers synced) whatever their role; the body says which.
  EXPECT_THAT(readyz(*a),
              StartsWith("200 ok: the pod and node informers have synced\nrole: leader"));
  EXPECT_THAT(readyz(*b),
              StartsWith("200 ok: the pod and node informers have synced\nrole: follower"));
  EXPECT_THAT(a->MetricsText(), HasSubstr("\ntessera_leader 1\n"));
  EXPECT_THAT(b->MetricsText(), HasSubstr("\ntessera_leader 0\n"));
  EXPECT_EQ(nlohmann::json::parse(b->DebugLedgerJson())["leadership"]["role"], "follower");

  // The leader stops (a rolling update): it releases the Lease; b leads within the lease
  // duration (polled, with a generous deadline for a loaded machine).
  const absl::Time stopped = absl::Now();
  a->Stop();
  ASSERT_TRUE(Eventually([&] { return b->IsLeader(); })) << b->LeaderDescription();
  TESSERA_LOG(kInfo, "takeover after {}", absl::FormatDuration(absl::Now() - stopped));
  EXPECT_THAT(readyz(*b), HasSubstr("role: leader"));
  EXPECT_TRUE(Eventually(
      [&] { return b->MetricsText().find("\ntessera_leader 1\n") != std::string::npos; }));

  // The new leader answers the plugin's next report.
  report("3");
  ASSERT_TRUE(Eventually([&] { return HasPrefix(handshake(), "Requesting_") && writes(*b) >= 1; }))
      << handshake() << " " << writes(*b);
  b->Stop();
}

// The default mode follows the kube-scheduler's Lease: the replica whose host holds it writes,
// and the role moves with the holder.
TEST_F(ServeTest, FollowModeWritesOnTheReplicaWhoseKubeSchedulerHoldsTheLease) {
  AddNode(NodeJson("old", "GPU-old-0,10,16000,100,NVIDIA-Tesla T4,0,true:", "Reported 1"));
  SetLeaseHolder("host-b_1f2e");
  std::unique_ptr<Service> a = StartFollowing("host-a");
  std::unique_ptr<Service> b = StartFollowing("host-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_FALSE(a->IsLeader()) << a->LeaderDescription();
  EXPECT_TRUE(b->IsLeader()) << b->LeaderDescription();
  EXPECT_THAT(b->LeaderDescription(), HasSubstr("held by \"host-b_1f2e\""));
  auto writes = [](Service& s) {
    return nlohmann::json::parse(s.DebugLedgerJson())["leadership"]["handshake_writes"]
        .get<uint64_t>();
  };
  ASSERT_TRUE(Eventually([&] { return writes(*b) >= 1; }));
  EXPECT_EQ(writes(*a), 0u);

  // host-a's kube-scheduler takes over (host-b's died): the role follows within a read.
  SetLeaseHolder("host-a_77c1");
  ASSERT_TRUE(Eventually([&] { return a->IsLeader() && !b->IsLeader(); }))
      << a->LeaderDescription() << " / " << b->LeaderDescription();
  EXPECT_TRUE(Eventually(
      [&] { return a->MetricsText().find("\ntessera_leader 1\n") != std::string::npos; }));
}

// tessera_leader is the role /readyz reports at the moment of the scrape, not the role of the
// last housekeeping round (CI saw a scrape say leader just after /readyz said follower).
TEST_F(ServeTest, TheLeaderMetricIsTheRoleAtTheScrape) {
  SetLeaseHolder("host-b_1f2e");
  auto rarely = [](ServeOptions& o) { o.housekeeping_period = absl::Hours(1); };
  std::unique_ptr<Service> a = StartFollowing("host-a", rarely);
  std::unique_ptr<Service> b = StartFollowing("host-b", rarely);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  SetLeaseHolder("host-a_77c1");
  ASSERT_TRUE(Eventually([&] { return a->IsLeader() && !b->IsLeader(); }))
      << a->LeaderDescription() << " / " << b->LeaderDescription();
  EXPECT_THAT(a->MetricsText(), HasSubstr("\ntessera_leader 1\n"));
  EXPECT_THAT(b->MetricsText(), HasSubstr("\ntessera_leader 0\n"));
}

// The sum of a family's samples over a /metrics body (0 when it has none).
double SumOf(const std::string& body, const std::string& family) {
  double sum = 0;
  for (const std::string& line : Split(body, '\n')) {
    if (HasPrefix(line, family + "{") || HasPrefix(line, family + " ")) {
      sum += std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return sum;
}

// Prometheus scrapes every replica: summed over both, HAMi's device families count each device
// once (only the leader exports them, legacy names included), and still once after the role
// moves. Every replica exports Tessera's own families.
TEST_F(ServeTest, TwoReplicasDoNotDoubleTheDeviceTotals) {
  AddNode(NodeJson("a", JsonRegister("a", 2, 16000)));
  AddNode(NodeJson("b", JsonRegister("b", 1, 8000)));
  const double capacity = (2 * 16000.0 + 8000.0) * 1048576;
  SetLeaseHolder("host-b_1f2e");
  auto legacy = [](ServeOptions& o) { o.legacy_metrics = true; };
  std::unique_ptr<Service> a = StartFollowing("host-a", legacy);
  std::unique_ptr<Service> b = StartFollowing("host-b", legacy);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_TRUE(a->WaitForSync(absl::Seconds(20)) && b->WaitForSync(absl::Seconds(20)));
  auto sum = [&](const std::string& family) {
    return SumOf(a->MetricsText(), family) + SumOf(b->MetricsText(), family);
  };
  EXPECT_EQ(sum("hami_gpu_memory_limit_bytes"), capacity);
  EXPECT_EQ(sum("GPUDeviceMemoryLimit"), capacity);
  EXPECT_EQ(sum("hami_gpu_core_limit_ratio"), 300.0);
  EXPECT_EQ(SumOf(b->MetricsText(), "hami_gpu_memory_limit_bytes"), capacity);
  EXPECT_THAT(a->MetricsText(), Not(HasSubstr("hami_")));
  EXPECT_THAT(a->MetricsText(), Not(HasSubstr("GPUDevice")));
  EXPECT_THAT(a->MetricsText(), HasSubstr("\ntessera_leader 0\n"));
  // Both replicas export Tessera's families, counters at 0 before any event, and the build.
  for (Service* s : {a.get(), b.get()}) {
    const std::string text = s->MetricsText();
    EXPECT_THAT(text, HasSubstr("\ntessera_filter_decisions_total{outcome=\"unschedulable\","
                                "reason=\"CardInsufficientMemory\"} 0\n"));
    EXPECT_THAT(text, HasSubstr("\ntessera_resync_corrections_total{kind=\"gone\"} 0\n"));
    EXPECT_THAT(text, HasSubstr("\ntessera_ledger_audit_corrections_total{cause=\"usage\"} 0\n"));
    EXPECT_THAT(text, HasSubstr("revision=\"" + std::string(metrics::BuildRevision()) + "\""));
  }
  EXPECT_THAT(std::string(metrics::BuildRevision()), MatchesRegex("([0-9a-f]{12}(-dirty)?)?"));

  SetLeaseHolder("host-a_77c1");
  ASSERT_TRUE(Eventually([&] { return a->IsLeader() && !b->IsLeader(); }))
      << a->LeaderDescription() << " / " << b->LeaderDescription();
  EXPECT_EQ(SumOf(a->MetricsText(), "hami_gpu_memory_limit_bytes"), capacity);
  EXPECT_EQ(SumOf(b->MetricsText(), "hami_gpu_memory_limit_bytes"), 0.0);
  EXPECT_EQ(sum("hami_gpu_memory_limit_bytes"), capacity);
}

// HAMi's hami.io/scheduler-role labels, wired: each replica knows its pod ($POD_NAME); the one
// whose kube-scheduler holds the Lease labels itself leader and the other replica follower,
// and the labels move with the Lease. A replica without a pod name writes none.
TEST_F(ServeTest, TheLeaderLabelsTheSchedulerPodsWithTheirRoles) {
  for (const char* name : {"sched-a", "sched-b"}) {
    ASSERT_TRUE(store()
                    .Create(Res("pods"), "kube-system",
                            nlohmann::json{
                                {"apiVersion", "v1"},
                                {"kind", "Pod"},
                                {"metadata",
                                 {{"name", name},
                                  {"namespace", "kube-system"},
                                  {"labels", {{"app.kubernetes.io/component", "hami-scheduler"}}}}},
                                {"spec", {{"containers", {{{"name", "c"}, {"image", "x"}}}}}}}
                                .dump())
                    .ok());
  }
  SetLeaseHolder("sched-b_1f2e");
  auto start = [&](const std::string& pod) {
    return StartFollowing(pod, [&](ServeOptions& o) {
      o.role_labels.pod_name = pod;  // the host name is the pod name
      o.role_labels.ns = "kube-system";
    });
  };
  auto role = [&](const std::string& name) {
    absl::StatusOr<std::string> json = store().Get(Res("pods"), "kube-system", name);
    return json.ok() ? nlohmann::json::parse(*json)["metadata"]["labels"].value(
                           "hami.io/scheduler-role", std::string("-"))
                     : std::string("?");
  };
  std::unique_ptr<Service> a = start("sched-a");
  std::unique_ptr<Service> b = start("sched-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_TRUE(Eventually([&] {
    return role("sched-a") == "follower" && role("sched-b") == "leader";
  })) << role("sched-a")
      << " " << role("sched-b");
  // The pass records what it wrote once its last PATCH is answered, which can be after the
  // store shows the labels.
  const nlohmann::json want_b = {{"sched-a", "follower"}, {"sched-b", "leader"}};
  nlohmann::json labels_b;
  EXPECT_TRUE(Eventually([&] {
    labels_b = nlohmann::json::parse(b->DebugLedgerJson())["leadership"]["role_labels"];
    return labels_b["pods"] == want_b;
  })) << labels_b.dump();
  EXPECT_EQ(labels_b["enabled"], true);
  EXPECT_EQ(nlohmann::json::parse(a->DebugLedgerJson())["leadership"]["role_labels"]["passes"], 0);

  // sched-a's kube-scheduler takes over: the labels follow.
  SetLeaseHolder("sched-a_77c1");
  EXPECT_TRUE(Eventually([&] {
    return role("sched-a") == "leader" && role("sched-b") == "follower";
  })) << role("sched-a")
      << " " << role("sched-b");
}

TEST_F(ServeTest, PodsWithoutDevicesPassThroughUntouched) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 16000)));
  StartService();
  nlohmann::json plain = nlohmann::json::parse(PodJson("cpu", {}));
  plain["spec"]["containers"] = {{{"name", "c"}, {"image", "busybox"}}};
  const std::string json = AddPod(plain.dump());
  nlohmann::json reply = Filter(json, {"a", "b", "c"});
  EXPECT_EQ(reply["NodeNames"], nlohmann::json({"a", "b", "c"}));
  EXPECT_FALSE(GetPod("cpu").meta.annotations.Contains("hami.io/vgpu-node"));
  EXPECT_EQ(Metric("tessera_filter_decisions_total", {"outcome=\"passthrough\""}), 1);
  EXPECT_EQ(Metric("tessera_filter_decisions_total", {"outcome=\"scheduled\""}), 0);
}

// The webhook on the extender listener, with the scheduler name and the device config given to
// serve: a memory-only pod gets defaultGPUNum devices and the profile's name.
TEST_F(ServeTest, WebhookUsesTheSchedulerNameAndTheDeviceConfig) {
  const std::string config = apisim().ScratchDir() + "/device-config.yaml";
  std::ofstream(config) << "nvidia:\n  defaultGPUNum: 2\n";
  StartService([&](ServeOptions& o) {
    o.scheduler_name = "tessera-test";
    o.device_config_file = config;
  });
  const char* source = std::getenv("TESSERA_SOURCE_DIR");
  std::ifstream in(std::string(source != nullptr ? source : ".") +
                   "/test/testdata/webhook/gpumem-only.json");
  std::stringstream body;
  body << in.rdbuf();
  auto res = client()->Post("/webhook", body.str(), "application/json");
  std::remove(config.c_str());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  nlohmann::json review = nlohmann::json::parse(res->body);
  EXPECT_EQ(review["response"]["uid"], "0f5e3c1a-6d8b-4a43-9a0e-2b1d3c4e5f60");
  ASSERT_TRUE(review["response"]["allowed"]);
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape(review["response"]["patch"].get<std::string>(), &patch));
  EXPECT_EQ(nlohmann::json::parse(patch), nlohmann::json::parse(R"([
    {"op":"add","path":"/spec/containers/0/resources/limits/nvidia.com~1gpu","value":"2"},
    {"op":"replace","path":"/spec/schedulerName","value":"tessera-test"}])"));
}

TEST_F(ServeTest, MalformedAndOversizedRequestsAreRefusedAndChangeNothing) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 16000)));
  StartService();
  auto bad = client()->Post("/filter", "{\"Pod\":", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto empty = client()->Post("/filter", "", "application/json");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->status, 400);
  // A 2 MiB body is refused from its Content-Length, before it is sent.
  EXPECT_THAT(RawRequest("POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         "Content-Length: 2097152\r\n\r\n"),
              StartsWith("HTTP/1.1 413"));
  auto bind = client()->Post("/bind", "[1,2]", "application/json");
  ASSERT_TRUE(bind);
  EXPECT_EQ(bind->status, 400);
  nlohmann::json debug = nlohmann::json::parse(service()->DebugLedgerJson());
  EXPECT_TRUE(debug["reservations"].empty());
  EXPECT_EQ(debug["records"], 0);
}

TEST_F(ServeTest, TwoPodsRacingForOneNodeLockBindOneAtATime) {
  AddNode(NodeJson("a", JsonRegister("a", 2, 16000)));
  // The loser waits this long for the winner's lock, which no device plugin releases here.
  StartService([](ServeOptions& o) { o.node_lock_retry_timeout = absl::Milliseconds(200); });
  ASSERT_EQ(FilterTo("one", {{.gpus = 1, .mem = 1000}}, {"a"}), "a");
  ASSERT_EQ(FilterTo("two", {{.gpus = 1, .mem = 1000}}, {"a"}), "a");
  const kube::Pod one = GetPod("one");
  const kube::Pod two = GetPod("two");
  nlohmann::json r1, r2;
  std::thread t1([&] {
    httplib::Client c("127.0.0.1", service()->port());
    nlohmann::json args = {
        {"PodName", "one"}, {"PodNamespace", "default"}, {"PodUID", one.meta.uid}, {"Node", "a"}};
    auto res = c.Post("/bind", args.dump(), "application/json");
    r1 = res ? nlohmann::json::parse(res->body) : nlohmann::json{{"Error", "no response"}};
  });
  std::thread t2([&] {
    httplib::Client c("127.0.0.1", service()->port());
    nlohmann::json args = {
        {"PodName", "two"}, {"PodNamespace", "default"}, {"PodUID", two.meta.uid}, {"Node", "a"}};
    auto res = c.Post("/bind", args.dump(), "application/json");
    r2 = res ? nlohmann::json::parse(res->body) : nlohmann::json{{"Error", "no response"}};
  });
  t1.join();
  t2.join();
  // The device plugin releases the lock after Allocate; without one, exactly one bind wins and
  // the loser holds nothing.
  const bool one_won = r1["Error"] == "";
  const bool two_won = r2["Error"] == "";
  EXPECT_NE(one_won, two_won) << r1.dump() << " " << r2.dump();
  const std::string loser = one_won ? "two" : "one";
  EXPECT_TRUE(GetPod(loser).node_name.empty());
  nlohmann::json debug = nlohmann::json::parse(service()->DebugLedgerJson());
  for (const auto& r : debug["reservations"]) {
    EXPECT_NE(r["name"], loser) << debug["reservations"].dump();
  }
  EXPECT_THAT(std::string(GetNode("a").meta.annotations.Get("hami.io/mutex.lock")),
              HasSubstr(one_won ? ",default,one" : ",default,two"));
}

TEST_F(ServeTest, LegacyMetricsCarryTheV25Names) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 16000)));
  StartService([](ServeOptions& o) { o.legacy_metrics = true; });
  ASSERT_EQ(FilterTo("p", {{.gpus = 1, .mem = 3000}}, {"a"}), "a");
  EXPECT_EQ(Metric("GPUDeviceMemoryAllocated", {"deviceuuid=\"GPU-a-0\"", "zone=\"vGPU\""}),
            3000.0 * 1048576);
  EXPECT_EQ(Metric("hami_gpu_memory_allocated_bytes", {"device_uuid=\"GPU-a-0\""}),
            3000.0 * 1048576);
  EXPECT_EQ(Metric("GPUDeviceMemoryLimit", {"deviceuuid=\"GPU-a-0\""}), 16000.0 * 1048576);
}

TEST_F(ServeTest, TheAuditRunsAndFindsNothingToRepairInAConsistentLedger) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 16000)));
  StartService([](ServeOptions& o) { o.audit_period = absl::Milliseconds(100); });
  ASSERT_EQ(FilterTo("p", {{.gpus = 1, .mem = 3000}}, {"a"}), "a");
  ASSERT_EQ(Bind(GetPod("p"), "a")["Error"], "");
  nlohmann::json audit;
  EXPECT_TRUE(Eventually([&] {
    audit = nlohmann::json::parse(service()->DebugLedgerJson())["audit"];
    return audit.is_object() && audit["pods"] == 1;
  })) << audit.dump();
  EXPECT_TRUE(audit["corrections"].empty()) << audit.dump();
  EXPECT_EQ(audit["nodes"], 1);
}

// ---- verdicts and /debug/why (issue #25) ----------------------------------------------------

// A pod no node can take gets its verdict through the API as a user sees it: the annotation
// (`kubectl get pod -o jsonpath`), the FilteringFailed event (`kubectl describe pod`), the
// pending-pods metric, the /debug/why replay with its what-ifs, and `tessera why`.
TEST_F(ServeTest, APendingPodsVerdictReachesTheUserThroughTheApi) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 16000)));
  StartService();
  ASSERT_EQ(FilterTo("small", {{.gpus = 1, .mem = 4000}}, {"a"}), "a");  // reserved, not bound
  const std::string big = AddPod(PodJson("big", {{.gpus = 1, .mem = 14000}}));
  for (int i = 0; i < 3; ++i) {  // kube-scheduler's retries
    nlohmann::json reply = Filter(big, {"a"});
    ASSERT_EQ(reply["NodeNames"], nlohmann::json::array()) << reply.dump();
  }
  auto verdict_on = [&](const std::string& name) -> std::string {
    absl::StatusOr<std::string> raw = store().Get(Res("pods"), "default", name);
    const nlohmann::json pod = nlohmann::json::parse(raw.ok() ? *raw : "{}");
    return pod.value("/metadata/annotations"_json_pointer, nlohmann::json::object())
        .value("tessera.io/verdict", "");
  };
  ASSERT_TRUE(Eventually([&] { return !verdict_on("big").empty(); }));
  const std::string written = verdict_on("big");
  const nlohmann::json v = nlohmann::json::parse(written);
  EXPECT_LE(written.size(), 1024u);
  EXPECT_EQ(v["reason"], "CardInsufficientMemory");
  EXPECT_EQ(v["nearest"]["node"], "a");
  EXPECT_EQ(v["nearest"]["need_mib"], 14000);
  EXPECT_EQ(v["nearest"]["free_mib"], 12000);
  EXPECT_EQ(v["nearest"]["held_by"][0]["pod"], "default/small");
  EXPECT_TRUE(v["nearest"]["held_by"][0].contains("reserved_until"));

  // One event with the verdict's text, however often the pod was retried.
  auto verdict_events = [&] {
    absl::StatusOr<std::string> list =
        store().List(*apisim::FindResource("", "v1", "events"), "default", {});
    std::vector<std::string> out;
    const nlohmann::json doc = nlohmann::json::parse(list.ok() ? *list : "{}");
    for (const auto& e : doc["items"]) {
      if (e["involvedObject"]["name"] == "big" && e["reason"] == "FilteringFailed" &&
          e.value("message", "").starts_with("{")) {
        out.push_back(e["message"]);
      }
    }
    return out;
  };
  ASSERT_TRUE(Eventually([&] { return !verdict_events().empty(); }));
  EXPECT_THAT(verdict_events(), ElementsAre(written));
  EXPECT_TRUE(Eventually(
      [&] { return Metric("tessera_pending_pods", {"reason=\"CardInsufficientMemory\""}) == 1; }));
  EXPECT_EQ(Metric("tessera_pending_pods", {"reason=\"node unregistered\""}), 0);

  // The live replay, and what would change it.
  httplib::Client metrics("127.0.0.1", service()->metrics_port());
  auto why = [&](const std::string& query) {
    auto res = metrics.Get("/debug/why?" + query);
    EXPECT_TRUE(res) << query;
    return res ? std::make_pair(res->status, res->body) : std::make_pair(0, std::string());
  };
  auto [status, body] = why("namespace=default&name=big");
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(nlohmann::json::parse(body)["verdict"]["nearest"]["free_mib"], 12000) << body;
  std::tie(status, body) = why("namespace=default&name=big&if-deleted=small");
  EXPECT_EQ(nlohmann::json::parse(body)["fits"], "a") << body;
  std::tie(status, body) = why("namespace=default&name=big&gpumem=12000");
  EXPECT_EQ(nlohmann::json::parse(body)["fits"], "a") << body;
  // The replay used a copy: the live ledger still holds small's reservation.
  EXPECT_EQ(nlohmann::json::parse(service()->DebugLedgerJson())["reservations"].size(), 1u);
  // Bad inputs: a clear 4xx, nothing else.
  for (const char* bad :
       {"name=big", "namespace=default", "namespace=Bad_NS&name=big",
        "namespace=default&name=big&x=1", "namespace=default&name=big&gpumem=0",
        "namespace=default&name=big&gpumem=abc", "namespace=default&name=big&if-deleted=a/b/c",
        "namespace=default&name=big&node=-x"}) {
    EXPECT_EQ(why(bad).first, 400) << bad << ": " << why(bad).second;
  }
  EXPECT_EQ(why("namespace=default&name=nope").first, 404);
  EXPECT_EQ(why("namespace=default&name=big&node=zzz").first, 404);

#ifdef TESSERA_BINARY_PATH
  // `tessera why` with the rights of a namespace user (its kubeconfig) and the replay.
  const std::string command = fmt::format(
      "{} why default/big --kubeconfig {} --server http://127.0.0.1:{} "
      "--if-deleted small 2>&1",
      TESSERA_BINARY_PATH, apisim().KubeconfigPath(), service()->metrics_port());
  std::string out;
  if (FILE* p = popen(command.c_str(), "r"); p != nullptr) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) {
      out.append(buf, n);
    }
    EXPECT_EQ(pclose(p), 0) << out;
  }
  std::printf("$ tessera why default/big --server ... --if-deleted small\n%s", out.c_str());
  EXPECT_THAT(out, HasSubstr("nearest miss: node a / GPU-a-0: needs 14000 MiB, 12000 free"));
  EXPECT_THAT(out, HasSubstr("4000 MiB held by the reservation of default/small, expires in"));
  EXPECT_THAT(out, HasSubstr("live replay if pod default/small were deleted:\nnode a fits"));
#endif

  // Scheduled: the verdict goes, and the pod no longer counts as pending.
  store().Delete(Res("pods"), "default", "small", R"({"gracePeriodSeconds":0})").IgnoreError();
  ASSERT_TRUE(Eventually(
      [&] { return nlohmann::json::parse(service()->DebugLedgerJson())["reservations"].empty(); }));
  nlohmann::json reply = Filter(big, {"a"});
  ASSERT_EQ(reply["NodeNames"], nlohmann::json::array({"a"})) << reply.dump();
  EXPECT_EQ(verdict_on("big"), "");
  EXPECT_EQ(Bind(GetPod("big"), "a")["Error"], "");
  EXPECT_TRUE(Eventually(
      [&] { return Metric("tessera_pending_pods", {"reason=\"CardInsufficientMemory\""}) == 0; }));
}

// The replay checks the namespace quota as the filter does: a pod its quota refused does not
// "fit" in the replay (it did: seen on the real control plane, test/controlplane/why_test.sh),
// and --if-deleted frees the deleted pod's share of the quota too.
TEST_F(ServeTest, TheWhyReplayChecksTheNamespaceQuota) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 16000)));
  AddGpuMemQuota(5000);
  StartService();
  ASSERT_EQ(FilterTo("small", {{.gpus = 1, .mem = 3000}}, {"a"}), "a");  // 3000 of the 5000
  const std::string big = AddPod(PodJson("big", {{.gpus = 1, .mem = 4000}}));
  ASSERT_TRUE(Eventually([&] { return Filter(big, {"a"})["NodeNames"].empty(); }));

  httplib::Client metrics("127.0.0.1", service()->metrics_port());
  auto why = [&](const std::string& query) {
    auto res = metrics.Get("/debug/why?" + query);
    EXPECT_TRUE(res && res->status == 200) << query;
    return nlohmann::json::parse(res ? res->body : "{}");
  };
  // The replay reads the pod from the informer, which may not have delivered it yet (404: it
  // failed so in CI).
  ASSERT_TRUE(Eventually([&] {
    auto res = metrics.Get("/debug/why?namespace=default&name=big");
    return res && res->status == 200;
  }));
  const nlohmann::json refused = why("namespace=default&name=big");
  ASSERT_FALSE(refused.contains("fits")) << refused.dump();
  EXPECT_EQ(refused["verdict"]["reason"], "ResourceQuotaNotFit") << refused.dump();
  EXPECT_EQ(refused["verdict"]["quota"],
            "namespace default: limits.nvidia.com/gpumem 5000, used 3000 + 4000 asked")
      << refused.dump();
  EXPECT_EQ(why("namespace=default&name=big&if-deleted=small")["fits"], "a");
  EXPECT_EQ(why("namespace=default&name=big&gpumem=2000")["fits"], "a");
}

// Issue #35: a refused pod goes back into kube-scheduler's queue (its tessera.io/requeue
// annotation changes: an update of a pending pod requeues it, docs/requeue.md) as soon as the
// capacity it fits in frees where kube-scheduler cannot see it. Here: a reservation that expired
// (a filter never followed by a bind).
TEST_F(ServeTest, ARefusedPodIsRequeuedWhenTheReservationHoldingItsCardExpires) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 16000)));
  StartService([](ServeOptions& o) { o.reservation_ttl = absl::Seconds(2); });
  // `ghost` takes the card and is never bound; `waiting` is refused for it.
  ASSERT_EQ(FilterTo("ghost", {{.gpus = 1, .mem = 16000}}, {"a"}), "a");
  const std::string waiting = AddPod(PodJson("waiting", {{.gpus = 1, .mem = 12000}}));
  ASSERT_TRUE(Filter(waiting, {"a"})["NodeNames"].empty());
  ASSERT_TRUE(
      Eventually([&] { return !StoredAnnotation("waiting", "tessera.io/verdict").empty(); }));
  EXPECT_EQ(StoredAnnotation("waiting", "tessera.io/requeue"), "");
  // The reservation expires: `waiting` (not `ghost`, never refused) is requeued, once.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(
      Eventually([&] { return !StoredAnnotation("waiting", "tessera.io/requeue").empty(); }));
  std::printf("requeued %s after the filter (reservation TTL 2s)\n",
              absl::FormatDuration(absl::Now() - start).c_str());
  EXPECT_EQ(StoredAnnotation("ghost", "tessera.io/requeue"), "");
  EXPECT_THAT(StoredAnnotation("waiting", "tessera.io/requeue"),
              MatchesRegex(R"(20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9:]+\.[0-9]+Z)"));
  EXPECT_TRUE(Eventually([&] { return Metric("tessera_pending_pods_requeued_total", {}) == 1; }));
  // kube-scheduler retries it: it fits now.
  EXPECT_EQ(FilterTo("waiting", {}, {"a"}, {}, /*create=*/false), "a");
}

// The same for a namespace quota that goes (kube-scheduler does not watch ResourceQuotas).
TEST_F(ServeTest, APodItsQuotaRefusedIsRequeuedWhenTheQuotaGoes) {
  AddNode(NodeJson("a", JsonRegister("a", 1, 16000)));
  AddGpuMemQuota(5000);
  StartService();
  const std::string over = AddPod(PodJson("over", {{.gpus = 1, .mem = 6000}}));
  ASSERT_TRUE(Filter(over, {"a"})["NodeNames"].empty());
  ASSERT_TRUE(Eventually([&] { return !StoredAnnotation("over", "tessera.io/verdict").empty(); }));
  EXPECT_EQ(StoredAnnotation("over", "tessera.io/requeue"), "");
  ASSERT_TRUE(store().Delete(Res("resourcequotas"), "default", "gpu", "").ok());
  const absl::Time deleted = absl::Now();
  ASSERT_TRUE(Eventually([&] { return !StoredAnnotation("over", "tessera.io/requeue").empty(); }));
  std::printf("quota deleted -> requeued in %s\n",
              absl::FormatDuration(absl::Now() - deleted).c_str());
  EXPECT_EQ(FilterTo("over", {}, {"a"}, {}, /*create=*/false), "a");
}

TEST_F(ServeTest, BadOptionsFailAtStartWithAMessage) {
  ServeOptions o = TestOptions();
  o.node_label_selector = "gpu";
  absl::Status s = Service::Start(o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  o.node_label_selector = "";
  o.device_config_file = apisim().ScratchDir() + "/missing.yaml";
  EXPECT_FALSE(Service::Start(o).ok());
  o.device_config_file = "";
  o.http_bind = "127.0.0.1";
  s = Service::Start(o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  o.http_bind = "127.0.0.1:0";
  o.kube.path = apisim().ScratchDir() + "/no-kubeconfig";
  EXPECT_FALSE(Service::Start(o).ok());
}

}  // namespace
}  // namespace tessera::serve
