// Issue 5's end-to-end scenarios that service_test.cc does not already cover, against the whole
// Service (informers, ledger, scheduler, HTTP, metrics) and an in-process apisim on port 0:
//   - the HAMi node lock: an expired lock and a lock whose owner pod is gone are taken over,
//     a young lock of a live pod is not, over the API server the Service really talks to;
//   - every bind failure reachable from outside leaves no reservation and no lock of ours;
//   - the Events FilteringSucceed / FilteringFailed / BindingSucceed / BindingFailed reach the
//     API server with the pod as their object;
//   - a multi-container, multi-GPU pod adds up in every HAMi device family and the pod family,
//     reserved, bound and deleted;
//   - --cert_file/--key_file: served over TLS, and a renewed pair taken without a restart;
//   - after each scenario /metrics is scraped, parsed, and compared with the expected values.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tessera/apisim/patch.h"
#include "tessera/apisim/server.h"
#include "tessera/apisim/tls.h"
#include "tessera/base/clock.h"
#include "tessera/kube/decode.h"
#include "tessera/serve/service.h"
#include "tessera/testing/serve_env.h"
#include "tessera/testing/wait.h"

namespace tessera::serve {
namespace {

using ::tessera::testing::Eventually;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

const apisim::ResourceInfo& Res(const char* name) { return *apisim::FindResource("", "v1", name); }

std::string Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

// A v2.8+ (JSON) registration: `gpus` GPUs of `mem` MiB, UUIDs GPU-<node>-<i>.
std::string NodeJson(const std::string& name, int gpus, int mem, const std::string& lock = "") {
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < gpus; ++i) {
    devices.push_back({{"id", "GPU-" + name + "-" + std::to_string(i)},
                       {"index", i},
                       {"count", 10},
                       {"devmem", mem},
                       {"devcore", 100},
                       {"type", "NVIDIA-A100"},
                       {"numa", 0},
                       {"health", true}});
  }
  nlohmann::json annotations = {{"hami.io/node-nvidia-register", devices.dump()}};
  if (!lock.empty()) {
    annotations["hami.io/mutex.lock"] = lock;
  }
  return nlohmann::json{{"apiVersion", "v1"},
                        {"kind", "Node"},
                        {"metadata", {{"name", name}, {"annotations", annotations}}},
                        {"status",
                         {{"allocatable", {{"nvidia.com/gpu", "10"}}},
                          {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}}
      .dump();
}

// A pending pod with one container asking for one GPU with `mem` MiB.
nlohmann::json PodObject(const std::string& name, int mem) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"schedulerName", "hami-scheduler"},
            {"containers",
             {{{"name", "c"},
               {"image", "cuda"},
               {"resources",
                {{"limits",
                  {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", std::to_string(mem)}}}}}}}}}}};
}

// One scrape of /metrics, parsed: "family{labels}" (labels as rendered) → value; every sample
// line must parse.
class Scrape {
 public:
  explicit Scrape(const std::string& body) {
    size_t start = 0;
    while (start < body.size()) {
      size_t end = body.find('\n', start);
      if (end == std::string::npos) {
        end = body.size();
      }
      const std::string line = body.substr(start, end - start);
      start = end + 1;
      if (line.empty() || line[0] == '#') {
        continue;
      }
      const size_t space = line.rfind(' ');
      EXPECT_NE(space, std::string::npos) << line;
      if (space == std::string::npos) {
        continue;
      }
      size_t used = 0;
      const std::string value = line.substr(space + 1);
      double v = std::nan("");
      try {
        v = std::stod(value, &used);
      } catch (...) {
      }
      EXPECT_EQ(used, value.size()) << "unparsable sample: " << line;
      samples_[line.substr(0, space)] = v;
    }
  }

  // The value of the one sample of `family` whose labels include every `labels` entry
  // (`name="value"` as rendered); NaN when there is none, a failure when there are several.
  double Get(const std::string& family, const std::vector<std::string>& labels = {}) const {
    double found = std::nan("");
    int matches = 0;
    for (const auto& [key, value] : samples_) {
      if (key != family && key.rfind(family + "{", 0) != 0) {
        continue;
      }
      bool all = true;
      for (const std::string& l : labels) {
        all = all && key.find(l) != std::string::npos;
      }
      if (all) {
        found = value;
        ++matches;
      }
    }
    EXPECT_LE(matches, 1) << family << " is ambiguous";
    return found;
  }
  // The sum over every sample of `family` (0 when none).
  double Sum(const std::string& family) const {
    double total = 0;
    for (const auto& [key, value] : samples_) {
      if (key == family || key.rfind(family + "{", 0) == 0) {
        total += value;
      }
    }
    return total;
  }

 private:
  std::map<std::string, double> samples_;
};

class ServeScenarioTest : public ::tessera::testing::ServeFixture {
 protected:
  // The audit runs only in the tests that set its period.
  ServeOptions TestOptions() override {
    ServeOptions o = ServeFixture::TestOptions();
    o.audit_period = absl::ZeroDuration();
    return o;
  }

  std::string Lock(const std::string& node) {
    absl::StatusOr<std::string> json = store().Get(Res("nodes"), "", node);
    absl::StatusOr<kube::Node> n = kube::DecodeNode(json.ok() ? *json : "{}");
    if (!n.ok()) {
      return "<no node>";
    }
    return n->meta.annotations.Contains("hami.io/mutex.lock")
               ? std::string(n->meta.annotations.Get("hami.io/mutex.lock"))
               : "<none>";
  }
  // The names of the pods holding a reservation, from /debug/ledger.
  std::vector<std::string> Reserved() {
    auto res = GetMetricsPort("/debug/ledger");  // /debug is served there
    EXPECT_TRUE(res && res->status == 200);
    std::vector<std::string> names;
    if (res) {
      const nlohmann::json debug = nlohmann::json::parse(res->body);
      for (const auto& r : debug["reservations"]) {
        names.push_back(r["name"]);
      }
    }
    return names;
  }
  Scrape Metrics() {
    auto res = GetMetricsPort("/metrics");
    EXPECT_TRUE(res && res->status == 200);
    return Scrape(res ? res->body : "");
  }
  double AllocatedMiB(const Scrape& s, const std::string& uuid) {
    return s.Get("hami_gpu_memory_allocated_bytes", {"device_uuid=\"" + uuid + "\""}) / 1048576.0;
  }

  // Creates a pod asking for `mem` MiB and filters it over `nodes`: the chosen node or "".
  std::string FilterNew(const std::string& name, int mem, const std::vector<std::string>& nodes) {
    nlohmann::json reply = Filter(AddPod(PodObject(name, mem).dump()), nodes);
    EXPECT_EQ(reply.value("Error", "x"), "") << reply.dump();
    return reply["NodeNames"].is_array() && reply["NodeNames"].size() == 1
               ? reply["NodeNames"][0].get<std::string>()
               : "";
  }
  // POST /bind; the "Error" string of the reply.
  std::string BindError(const std::string& name, const std::string& uid, const std::string& node) {
    const nlohmann::json reply = Bind(name, uid, node);
    return reply.is_object() ? reply.value("Error", "<no Error key>") : "<no response>";
  }

  // The service's clock in the tests that set it (TearDown stops the service before it goes).
  FakeClock clock_{absl::Now()};
};

TEST_F(ServeScenarioTest, ExpiredAndOrphanedLocksAreTakenOverAndALiveOneIsNot) {
  const absl::Time now = absl::Now();
  // The owner of node c's lock exists and locked it a minute ago: its lock holds.
  AddPod(PodObject("holder", 1000).dump());
  const std::string young = Rfc3339(now - absl::Minutes(1)) + ",default,holder";
  // Node a: the same live owner, but 10 minutes ago (--node-lock-timeout is 5m).
  AddNode(NodeJson("a", 1, 16000, Rfc3339(now - absl::Minutes(10)) + ",default,holder"));
  // Node b: a fresh lock of a pod that no longer exists.
  AddNode(NodeJson("b", 1, 16000, Rfc3339(now - absl::Seconds(5)) + ",default,ghost"));
  AddNode(NodeJson("c", 1, 16000, young));
  // The bind to c waits for the holder this long (for real) before it is refused.
  StartService([](ServeOptions& o) { o.node_lock_retry_timeout = absl::Milliseconds(300); });

  ASSERT_EQ(FilterNew("p1", 1000, {"a"}), "a");
  EXPECT_EQ(BindError("p1", GetPod("p1").meta.uid, "a"), "");
  EXPECT_THAT(Lock("a"), HasSubstr(",default,p1"));
  EXPECT_EQ(GetPod("p1").node_name, "a");

  ASSERT_EQ(FilterNew("p2", 2000, {"b"}), "b");
  EXPECT_EQ(BindError("p2", GetPod("p2").meta.uid, "b"), "");
  EXPECT_THAT(Lock("b"), HasSubstr(",default,p2"));
  EXPECT_EQ(GetPod("p2").node_name, "b");

  ASSERT_EQ(FilterNew("p3", 3000, {"c"}), "c");
  EXPECT_THAT(Reserved(), ::testing::Contains("p3"));
  EXPECT_EQ(AllocatedMiB(Metrics(), "GPU-c-0"), 3000);  // the reservation counts until the bind
  const absl::Time before_p3 = absl::Now();
  const std::string refused = BindError("p3", GetPod("p3").meta.uid, "c");
  EXPECT_THAT(refused, HasSubstr("locked by default/holder"));
  EXPECT_THAT(refused, HasSubstr("gave up after waiting"));
  EXPECT_GE(absl::Now() - before_p3, absl::Milliseconds(300));
  EXPECT_EQ(Lock("c"), young);
  EXPECT_TRUE(GetPod("p3").node_name.empty());
  EXPECT_THAT(Reserved(), ::testing::Not(::testing::Contains("p3")));

  // The bound pods hold their memory (as reservation or, once the informer saw the binding, as
  // a record); the refused one holds nothing.
  Scrape m = Metrics();
  EXPECT_EQ(AllocatedMiB(m, "GPU-a-0"), 1000);
  EXPECT_EQ(AllocatedMiB(m, "GPU-b-0"), 2000);
  EXPECT_EQ(AllocatedMiB(m, "GPU-c-0"), 0);
  EXPECT_EQ(m.Get("tessera_filter_decisions_total", {"outcome=\"scheduled\""}), 3);
  EXPECT_EQ(m.Get("tessera_bind_total", {"outcome=\"bound\""}), 2);
  // A live owner's lock is a refusal, not an API error.
  EXPECT_EQ(m.Get("tessera_bind_total", {"outcome=\"rejected\""}), 1);
  EXPECT_TRUE(std::isnan(m.Get("tessera_bind_total", {"outcome=\"error\""})) ||
              m.Get("tessera_bind_total", {"outcome=\"error\""}) == 0);
  EXPECT_EQ(m.Get("tessera_bind_duration_seconds_count"), 3);
  EXPECT_EQ(m.Get("tessera_filter_duration_seconds_count"), 3);
}

TEST_F(ServeScenarioTest, EveryBindFailureLeavesNothingReservedAndNoLockHeld) {
  AddNode(NodeJson("a", 1, 16000));
  AddNode(NodeJson("b", 1, 16000));
  StartService();
  int failures = 0;
  auto expect_nothing_held = [&](const std::string& pod, const char* path) {
    SCOPED_TRACE(path);
    ++failures;
    EXPECT_THAT(Reserved(), ::testing::Not(::testing::Contains(pod)));
    EXPECT_EQ(Lock("a"), "<none>");
    EXPECT_EQ(Lock("b"), "<none>");
    Scrape m = Metrics();
    EXPECT_EQ(m.Get("tessera_bind_total", {"outcome=\"bound\""}), 0);
    EXPECT_EQ(m.Get("tessera_bind_total", {"outcome=\"rejected\""}) +
                  m.Get("tessera_bind_total", {"outcome=\"error\""}),
              failures);
    EXPECT_EQ(m.Get("tessera_reservations_in_flight"), static_cast<double>(Reserved().size()));
  };

  // 1. A bind with no filter before it (no reservation).
  {
    const std::string json = AddPod(PodObject("unfiltered", 1000).dump());
    const std::string uid = nlohmann::json::parse(json)["metadata"]["uid"];
    EXPECT_NE(BindError("unfiltered", uid, "a"), "");
    expect_nothing_held("unfiltered", "no reservation");
    EXPECT_EQ(AllocatedMiB(Metrics(), "GPU-a-0"), 0);
  }
  // 2. A bind to another node than the filter chose.
  {
    ASSERT_EQ(FilterNew("wrong", 1000, {"a"}), "a");
    ASSERT_THAT(Reserved(), ::testing::ElementsAre("wrong"));
    EXPECT_THAT(BindError("wrong", GetPod("wrong").meta.uid, "b"), HasSubstr("not b"));
    expect_nothing_held("wrong", "other node");
    Scrape m = Metrics();
    EXPECT_EQ(AllocatedMiB(m, "GPU-a-0"), 0);
    EXPECT_EQ(AllocatedMiB(m, "GPU-b-0"), 0);
  }
  // 3. The pod was deleted between filter and bind.
  {
    ASSERT_EQ(FilterNew("gone", 1000, {"a"}), "a");
    const std::string uid(GetPod("gone").meta.uid);
    ASSERT_TRUE(store().Delete(Res("pods"), "default", "gone", R"({"gracePeriodSeconds":0})").ok());
    EXPECT_NE(BindError("gone", uid, "a"), "");
    expect_nothing_held("gone", "pod deleted");
    EXPECT_EQ(AllocatedMiB(Metrics(), "GPU-a-0"), 0);
  }
  // 4. The reserved memory was taken by a pod another scheduler bound meanwhile.
  {
    ASSERT_EQ(FilterNew("late", 10000, {"a"}), "a");
    nlohmann::json intruder = PodObject("intruder", 10000);
    intruder["metadata"]["annotations"] = {
        {"hami.io/vgpu-node", "a"},
        {"hami.io/vgpu-devices-allocated", "GPU-a-0,NVIDIA,10000,0:;"},
        {"hami.io/bind-phase", "success"}};
    intruder["spec"]["nodeName"] = "a";
    intruder["status"] = {{"phase", "Running"}};
    AddPod(intruder.dump());
    ASSERT_TRUE(Eventually([&] { return AllocatedMiB(Metrics(), "GPU-a-0") == 20000; }));
    EXPECT_THAT(BindError("late", GetPod("late").meta.uid, "a"), HasSubstr("no longer free"));
    expect_nothing_held("late", "devices taken");
    EXPECT_TRUE(GetPod("late").node_name.empty());
    EXPECT_EQ(AllocatedMiB(Metrics(), "GPU-a-0"), 10000);  // the intruder's only
  }
  // 5. The pod was bound by someone else between filter and bind (the binding is refused).
  {
    ASSERT_EQ(FilterNew("taken", 1000, {"b"}), "b");
    const std::string uid(GetPod("taken").meta.uid);
    ASSERT_TRUE(store()
                    .Bind("default", "taken",
                          R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"taken"},)"
                          R"("target":{"kind":"Node","name":"b"}})")
                    .ok());
    // ("already assigned" from the API server, or from the ledger once the informer has seen
    // the binding.)
    EXPECT_THAT(BindError("taken", uid, "b"), HasSubstr("already"));
    // Refused without touching anything: the pod runs on b with the filter's devices, so its
    // share never looks free — the reservation holds until the informer sees the binding,
    // then the pod's record does.
    ++failures;
    EXPECT_EQ(AllocatedMiB(Metrics(), "GPU-b-0"), 1000);
    EXPECT_EQ(Lock("b"), "<none>");
    EXPECT_TRUE(Eventually([&] {
      std::vector<std::string> reserved = Reserved();
      return std::find(reserved.begin(), reserved.end(), "taken") == reserved.end();
    }));
    EXPECT_EQ(AllocatedMiB(Metrics(), "GPU-b-0"), 1000);
  }
  // None of the failures created a binding.
  for (const char* name : {"unfiltered", "wrong", "late"}) {
    EXPECT_TRUE(GetPod(name).node_name.empty()) << name;
  }
}

TEST_F(ServeScenarioTest, FilterAndBindEventsReachTheApiServer) {
  AddNode(NodeJson("a", 1, 16000));
  StartService();
  ASSERT_EQ(FilterNew("fits", 4000, {"a"}), "a");
  EXPECT_EQ(BindError("fits", GetPod("fits").meta.uid, "a"), "");
  nlohmann::json reply = Filter(AddPod(PodObject("huge", 64000).dump()), {"a"});
  EXPECT_THAT(reply["NodeNames"], IsEmpty()) << reply.dump();
  EXPECT_THAT(std::string(reply["FailedNodes"]["a"]), StartsWith("1/1 ")) << reply.dump();
  EXPECT_NE(BindError("huge", GetPod("huge").meta.uid, "a"), "");

  // Events are posted asynchronously: wait for all four.
  std::multimap<std::string, nlohmann::json> events;  // reason → event
  ASSERT_TRUE(Eventually([&] {
    events.clear();
    absl::StatusOr<std::string> list = store().List(Res("events"), "default", {});
    if (!list.ok()) {
      return false;
    }
    const nlohmann::json parsed = nlohmann::json::parse(*list);
    for (const auto& e : parsed["items"]) {
      events.emplace(e["reason"].get<std::string>(), e);
    }
    return events.count("FilteringSucceed") == 1 && events.count("FilteringFailed") >= 1 &&
           events.count("BindingSucceed") == 1 && events.count("BindingFailed") == 1;
  })) << events.size()
      << " events";
  auto involved = [&](const char* reason) { return events.find(reason)->second["involvedObject"]; };
  EXPECT_EQ(involved("FilteringSucceed")["name"], "fits");
  EXPECT_EQ(involved("FilteringSucceed")["uid"], GetPod("fits").meta.uid);
  EXPECT_EQ(involved("BindingSucceed")["name"], "fits");
  EXPECT_EQ(involved("FilteringFailed")["name"], "huge");
  EXPECT_EQ(involved("BindingFailed")["name"], "huge");
  EXPECT_EQ(events.find("FilteringSucceed")->second["type"], "Normal");
  EXPECT_EQ(events.find("BindingSucceed")->second["type"], "Normal");
  EXPECT_EQ(events.find("FilteringFailed")->second["type"], "Warning");
  EXPECT_EQ(events.find("BindingFailed")->second["type"], "Warning");
  EXPECT_THAT(events.find("FilteringSucceed")->second["message"].get<std::string>(),
              HasSubstr("find fit node(a)"));

  Scrape m = Metrics();
  EXPECT_EQ(m.Get("tessera_filter_decisions_total", {"outcome=\"scheduled\""}), 1);
  // The unschedulable decision carries the reason the candidates gave.
  EXPECT_EQ(m.Get("tessera_filter_decisions_total",
                  {"outcome=\"unschedulable\"", "reason=\"CardInsufficientMemory\""}),
            1);
  EXPECT_EQ(m.Get("tessera_bind_total", {"outcome=\"bound\""}), 1);
  EXPECT_EQ(AllocatedMiB(m, "GPU-a-0"), 4000);
  EXPECT_EQ(m.Get("hami_gpu_memory_limit_bytes", {"device_uuid=\"GPU-a-0\""}) / 1048576.0, 16000);
}

// Issue #21: a running pod whose allocation does not decode keeps its node unavailable (with
// the pod named in FailedNodes), until it is fixed; a bound pod whose allocation names another
// scheduler is counted and reported. The audit's gauge counts both.
TEST_F(ServeScenarioTest, UnreadableAndForeignAllocationsAreHeldAndReported) {
  AddNode(NodeJson("a", 1, 16000));
  nlohmann::json broken = PodObject("broken", 4000);
  broken["spec"]["schedulerName"] = "volcano";
  broken["spec"]["nodeName"] = "a";
  broken["metadata"]["annotations"] = {
      {"hami.io/vgpu-node", "a"}, {"hami.io/vgpu-devices-allocated", "GPU-a-0,NVIDIA,lots,10:;"}};
  broken["status"] = {{"phase", "Running"}};
  AddPod(broken.dump());
  StartService([](ServeOptions& o) { o.audit_period = absl::Milliseconds(100); });

  nlohmann::json reply = Filter(AddPod(PodObject("new", 1000).dump()), {"a"});
  EXPECT_THAT(reply["NodeNames"], IsEmpty()) << reply.dump();
  EXPECT_EQ(reply["FailedNodes"]["a"],
            "node has an allocation Tessera cannot read (pod default/broken)")
      << reply.dump();
  ASSERT_TRUE(Eventually([&] {
    Scrape m = Metrics();
    return m.Get("tessera_ledger_problems", {"kind=\"unreadable\""}) == 1 &&
           m.Get("tessera_ledger_problems", {"kind=\"foreign_allocation\""}) == 1;
  }));
  httplib::Client metrics("127.0.0.1", service()->metrics_port());  // /debug is served there
  auto res = metrics.Get("/debug/audit");
  ASSERT_TRUE(res && res->status == 200);
  const nlohmann::json audit = nlohmann::json::parse(res->body);
  EXPECT_EQ(audit["audit"]["foreign_allocations"][0]["name"], "broken") << audit.dump();
  EXPECT_EQ(audit["audit"]["foreign_allocations"][0]["scheduler"], "volcano");
  EXPECT_EQ(audit["problems"]["unreadable"][0]["name"], "broken") << audit.dump();
  // The metric's reason label does not carry the pod name.
  EXPECT_EQ(Metrics().Get("tessera_filter_decisions_total",
                          {"outcome=\"unschedulable\"",
                           "reason=\"node has an allocation Tessera cannot read\""}),
            1);

  // Fixed: counted (a foreign allocation still holds its 4000 MiB), the node offered again.
  ASSERT_TRUE(store()
                  .Patch(Res("pods"), "default", "broken", "", apisim::PatchType::kMerge,
                         R"({"metadata":{"annotations":{"hami.io/vgpu-devices-allocated":)"
                         R"("GPU-a-0,NVIDIA,4000,10:;"}}})")
                  .ok());
  ASSERT_TRUE(Eventually([&] { return AllocatedMiB(Metrics(), "GPU-a-0") == 4000; }));
  EXPECT_EQ(FilterNew("new2", 1000, {"a"}), "a");
  ASSERT_TRUE(Eventually([&] {
    Scrape m = Metrics();
    return m.Get("tessera_ledger_problems", {"kind=\"unreadable\""}) == 0 &&
           m.Get("tessera_ledger_problems", {"kind=\"foreign_allocation\""}) == 1;
  }));
}

// Issue #41 finding 2: the owner of a running pod patches its allocation from 12,000 MiB to
// 1 MiB through the API. The ledger keeps the decision (the 16,000 MiB card is not offered to a
// second 12,000 MiB pod), the audit reports the rewrite in /debug/audit and the metrics, and a
// Warning event names it on the pod.
TEST_F(ServeScenarioTest, ARewrittenAllocationOfARunningPodKeepsTheDecisionAndIsReported) {
  AddNode(NodeJson("a", 1, 16000));
  StartService([](ServeOptions& o) { o.audit_period = absl::Milliseconds(100); });
  ASSERT_EQ(FilterNew("tenant", 12000, {"a"}), "a");
  ASSERT_EQ(BindError("tenant", GetPod("tenant").meta.uid, "a"), "");
  ASSERT_TRUE(Eventually([&] { return Reserved().empty(); }));  // observed bound
  ASSERT_TRUE(store()
                  .Patch(Res("pods"), "default", "tenant", "", apisim::PatchType::kMerge,
                         R"({"metadata":{"annotations":{"hami.io/vgpu-devices-allocated":)"
                         R"("GPU-a-0,NVIDIA,1,0:;"}}})")
                  .ok());
  ASSERT_TRUE(Eventually([&] {
    Scrape m = Metrics();
    return m.Get("tessera_ledger_problems", {"kind=\"rewritten\""}) == 1 &&
           m.Get("tessera_allocation_rewrites_total") == 1;
  })) << "the audit did not report the rewrite";
  EXPECT_EQ(AllocatedMiB(Metrics(), "GPU-a-0"), 12000);

  httplib::Client metrics("127.0.0.1", service()->metrics_port());  // /debug is served there
  auto res = metrics.Get("/debug/audit");
  ASSERT_TRUE(res && res->status == 200);
  const nlohmann::json audit = nlohmann::json::parse(res->body);
  const nlohmann::json& rewritten = audit["audit"]["problems"]["rewritten"];
  ASSERT_EQ(rewritten.size(), 1U) << audit.dump();
  EXPECT_EQ(rewritten[0]["name"], "tenant");
  EXPECT_EQ(rewritten[0]["kept"]["devices"], "GPU-a-0,NVIDIA,12000,0:;");
  EXPECT_EQ(rewritten[0]["rewritten"]["devices"], "GPU-a-0,NVIDIA,1,0:;");
  EXPECT_EQ(audit["audit"]["corrections"], nlohmann::json::object()) << audit.dump();

  // A second 12,000 MiB pod is refused: the card holds 12,000 of its 16,000 MiB.
  nlohmann::json reply = Filter(AddPod(PodObject("second", 12000).dump()), {"a"});
  EXPECT_THAT(reply["NodeNames"], IsEmpty()) << reply.dump();
  EXPECT_TRUE(reply["FailedNodes"].contains("a")) << reply.dump();

  nlohmann::json event;
  ASSERT_TRUE(Eventually([&] {
    absl::StatusOr<std::string> list = store().List(Res("events"), "default", {});
    if (!list.ok()) {
      return false;
    }
    const nlohmann::json parsed = nlohmann::json::parse(*list);
    for (const auto& e : parsed["items"]) {
      if (e["reason"] == "AllocationRewritten") {
        event = e;
        return true;
      }
    }
    return false;
  }));
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_EQ(event["involvedObject"]["name"], "tenant");
  EXPECT_THAT(event["message"].get<std::string>(), HasSubstr("GPU-a-0 12000MiB"));
  EXPECT_EQ(Metrics().Get("tessera_allocation_rewrites_total"), 1);  // once, not per audit
}

// A two-container pod (1 GPU with 30 % of its cores, then 2 GPUs) on a 4-GPU node: every HAMi
// device family and the pod family add up to what it asked for, while reserved and once bound;
// deleting it brings them all back to zero.
TEST_F(ServeScenarioTest, AMultiContainerMultiGpuPodAddsUpInEveryFamily) {
  AddNode(NodeJson("m", 4, 10000));
  StartService();
  nlohmann::json pod = PodObject("multi", 1000);
  pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = "30";
  pod["spec"]["containers"].push_back(
      {{"name", "c2"},
       {"image", "cuda"},
       {"resources", {{"limits", {{"nvidia.com/gpu", "2"}, {"nvidia.com/gpumem", "3000"}}}}}});
  nlohmann::json reply = Filter(AddPod(pod.dump()), {"m"});
  ASSERT_EQ(reply["NodeNames"], nlohmann::json({"m"})) << reply.dump();
  auto expect_usage = [&](double mib, double shared, double cores, const char* when) {
    SCOPED_TRACE(when);
    Scrape m = Metrics();
    EXPECT_EQ(m.Sum("hami_gpu_memory_allocated_bytes") / 1048576.0, mib);
    EXPECT_EQ(m.Sum("hami_gpu_shared_count"), shared);
    EXPECT_EQ(m.Sum("hami_gpu_core_allocated_ratio"), cores);
    EXPECT_EQ(m.Sum("hami_vgpu_memory_allocated_bytes") / 1048576.0, mib);
    EXPECT_EQ(m.Sum("hami_gpu_memory_limit_bytes") / 1048576.0, 40000);
  };
  expect_usage(7000, 3, 30, "reserved");
  EXPECT_EQ(Metrics().Get("tessera_reservations_in_flight"), 1);
  ASSERT_EQ(BindError("multi", GetPod("multi").meta.uid, "m"), "");
  ASSERT_TRUE(Eventually([&] { return Reserved().empty(); }));  // the informer saw the binding
  expect_usage(7000, 3, 30, "bound");
  ASSERT_TRUE(store().Delete(Res("pods"), "default", "multi", R"({"gracePeriodSeconds":0})").ok());
  ASSERT_TRUE(Eventually([&] { return Metrics().Sum("hami_gpu_shared_count") == 0; }));
  expect_usage(0, 0, 0, "deleted");
}

// MIG end to end (docs/mig.md; the protocol reference's worked A100-40GB example, HAMi v2.10.0
// device.go PatchAnnotations and mig_allocations.go EncodeMigAllocations): a node registered with
// migProfiles, a pod filtered and bound with the annotations byte for byte, the plugin's
// realisation read back, and the placement free again once the pod is deleted.
TEST_F(ServeScenarioTest, AMigPodIsPlacedBoundRealisedAndFreed) {
  constexpr char kUuid[] = "GPU-5d1c7e2a-0000-4000-8000-000000000001";
  const std::string registration =
      std::string(R"([{"id":")") + kUuid +
      R"(","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA A100-SXM4-40GB","mode":"mig",)"
      R"("migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":)"
      R"([{"start":0,"size":1},{"start":1,"size":1},{"start":2,"size":1},{"start":3,"size":1},)"
      R"({"start":4,"size":1},{"start":5,"size":1},{"start":6,"size":1}]},{"name":"2g.10gb",)"
      R"("memoryMB":9856,"core":29,"sliceCount":2,"placements":[{"start":0,"size":2},{"start":2,)"
      R"("size":2},{"start":4,"size":2}]},{"name":"3g.20gb","memoryMB":19968,"core":43,)"
      R"("sliceCount":3,"placements":[{"start":0,"size":4},{"start":4,"size":4}]},)"
      R"({"name":"7g.40gb","memoryMB":40192,"core":100,"sliceCount":7,"placements":[{"start":0,)"
      R"("size":8}]}],"health":true}])";
  nlohmann::json node = nlohmann::json::parse(NodeJson("gpu-a100-1", 0, 0));
  node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = registration;
  AddNode(node.dump());
  // A short reservation TTL: the audit reports an unrealised reservation after it.
  StartService([](ServeOptions& o) {
    o.audit_period = absl::Milliseconds(100);
    o.reservation_ttl = absl::Seconds(1);
  });
  auto audit_mig = [&] {
    auto res = GetMetricsPort("/debug/audit");
    return res ? nlohmann::json::parse(res->body, nullptr, false)["audit"]["mig"]
               : nlohmann::json();
  };
  auto mig_pod = [&](const std::string& name, int mem) {
    nlohmann::json pod = PodObject(name, mem);
    pod["metadata"]["annotations"] = {{"nvidia.com/vgpu-mode", "mig"}};
    return AddPod(pod.dump());
  };
  auto allocation = [&](int start, const std::string& runtime = "") {
    return std::string(R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":")") + kUuid +
           R"(","profile":"1g.5gb","placement":{"start":)" + std::to_string(start) +
           R"(,"size":1})" + runtime + "}]";
  };
  const std::string devices = std::string(kUuid) + ",NVIDIA,4864,15:;";

  nlohmann::json reply = Filter(mig_pod("infer-0", 4000), {"gpu-a100-1"});
  ASSERT_EQ(reply["NodeNames"], nlohmann::json({"gpu-a100-1"})) << reply.dump();
  kube::Pod pod = GetPod("infer-0");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-devices-to-allocate"), devices);
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-devices-allocated"), devices);
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/vgpu-mig-allocations"), allocation(6));
  EXPECT_EQ(AllocatedMiB(Metrics(), kUuid), 4864);
  ASSERT_EQ(BindError("infer-0", pod.meta.uid, "gpu-a100-1"), "");
  ASSERT_TRUE(Eventually([&] { return Reserved().empty(); }));
  // Bound but not realised past the reservation TTL: the audit says so.
  ASSERT_TRUE(Eventually([&] {
    const nlohmann::json mig = audit_mig();
    return mig.is_array() && mig.size() == 1 && mig[0]["kind"] == "unrealised" &&
           mig[0]["name"] == "infer-0";
  })) << audit_mig().dump();

  // The device plugin realises the instance: it merge-patches the runtime identity in, and
  // (its allocation done) releases the node lock.
  auto release_lock = [&] {
    ASSERT_TRUE(store()
                    .Patch(Res("nodes"), "", "gpu-a100-1", "", apisim::PatchType::kMerge,
                           R"({"metadata":{"annotations":{"hami.io/mutex.lock":null}}})")
                    .ok());
  };
  release_lock();
  const std::string realised =
      allocation(6, R"(,"migUUID":"MIG-9b0e","gpuInstanceID":13,"computeInstanceID":0)");
  ASSERT_TRUE(
      store()
          .Patch(Res("pods"), "default", "infer-0", "", apisim::PatchType::kMerge,
                 nlohmann::json{
                     {"metadata", {{"annotations", {{"hami.io/vgpu-mig-allocations", realised}}}}}}
                     .dump())
          .ok());
  ASSERT_TRUE(Eventually([&] { return audit_mig() == nlohmann::json::array(); }))
      << audit_mig().dump();
  // The realised instance still holds its placement: the next pod gets start 5, as in HAMi.
  reply = Filter(mig_pod("infer-1", 4000), {"gpu-a100-1"});
  ASSERT_EQ(reply["NodeNames"], nlohmann::json({"gpu-a100-1"})) << reply.dump();
  EXPECT_EQ(GetPod("infer-1").meta.annotations.Get("hami.io/vgpu-mig-allocations"), allocation(5));
  ASSERT_EQ(BindError("infer-1", GetPod("infer-1").meta.uid, "gpu-a100-1"), "");
  ASSERT_TRUE(Eventually([&] { return Reserved().empty(); }));
  release_lock();
  // 8000 MiB: 2g.10gb from the bottom, at 0.
  reply = Filter(mig_pod("mid", 8000), {"gpu-a100-1"});
  ASSERT_EQ(reply["NodeNames"], nlohmann::json({"gpu-a100-1"})) << reply.dump();
  EXPECT_THAT(GetPod("mid").meta.annotations.Get("hami.io/vgpu-mig-allocations"),
              HasSubstr(R"("profile":"2g.10gb","placement":{"start":0,"size":2}})"));
  ASSERT_EQ(BindError("mid", GetPod("mid").meta.uid, "gpu-a100-1"), "");
  ASSERT_TRUE(Eventually([&] { return Reserved().empty(); }));

  // 15000 MiB: 3g at 4 overlaps 5 and 6, 3g at 0 overlaps 0-1, 7g everything (reference §2.4).
  reply = Filter(mig_pod("big", 15000), {"gpu-a100-1"});
  EXPECT_THAT(reply.dump(), HasSubstr("CardMigTopologyInfeasible")) << reply.dump();

  // infer-0 deleted: start 6 is free again and the next 1g goes there.
  ASSERT_TRUE(
      store().Delete(Res("pods"), "default", "infer-0", R"({"gracePeriodSeconds":0})").ok());
  ASSERT_TRUE(Eventually([&] { return AllocatedMiB(Metrics(), kUuid) == 4864 + 9856; }));
  reply = Filter(mig_pod("infer-2", 4000), {"gpu-a100-1"});
  ASSERT_EQ(reply["NodeNames"], nlohmann::json({"gpu-a100-1"})) << reply.dump();
  EXPECT_EQ(GetPod("infer-2").meta.annotations.Get("hami.io/vgpu-mig-allocations"), allocation(6));
}

// Whether a fresh client trusting only the certificate in `ca_file` gets /healthz over TLS.
bool TrustedBy(int port, const std::string& ca_file) {
  httplib::SSLClient c("127.0.0.1", port);
  c.set_ca_cert_path(ca_file.c_str());
  c.enable_server_certificate_verification(true);
  c.set_connection_timeout(5);
  c.set_read_timeout(10);
  httplib::Result r = c.Get("/healthz");
  return r && r->status == 200;
}

// --cert_file / --key_file: the extender serves kube-scheduler over TLS with the given pair and
// takes a renewed pair (cert-manager rewrites the Secret's files) without a restart, re-reading
// the files at most once per 5 s of the service's clock (a FakeClock here). The reload's timing
// and refusal of broken pairs are tested in extender/http_server_test.cc.
TEST_F(ServeScenarioTest, ServesTlsAndTakesARenewedCertificateWithoutARestart) {
  absl::StatusOr<apisim::PemPair> a = apisim::GenerateSelfSignedCert();
  absl::StatusOr<apisim::PemPair> b = apisim::GenerateSelfSignedCert();
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string crt = apisim().ScratchDir() + "/tls.crt",
                    key = apisim().ScratchDir() + "/tls.key";
  const std::string a_pem = apisim().ScratchDir() + "/a.pem",
                    b_pem = apisim().ScratchDir() + "/b.pem";
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path + ".tmp") << text;
    std::rename((path + ".tmp").c_str(), path.c_str());
  };
  write(crt, a->cert_pem);
  write(key, a->key_pem);
  write(a_pem, a->cert_pem);
  write(b_pem, b->cert_pem);
  AddNode(NodeJson("a", 1, 16000));
  StartService([&](ServeOptions& o) {
    o.cert_file = crt;
    o.key_file = key;
    o.clock = &clock_;
  });
  EXPECT_TRUE(TrustedBy(service()->port(), a_pem));
  EXPECT_FALSE(TrustedBy(service()->port(), b_pem));
  {
    // kube-scheduler's /filter over TLS.
    httplib::SSLClient c("127.0.0.1", service()->port());
    c.set_ca_cert_path(a_pem.c_str());
    c.enable_server_certificate_verification(true);
    nlohmann::json args = {{"Pod", nlohmann::json::parse(AddPod(PodObject("tls", 1000).dump()))},
                           {"Nodes", nullptr},
                           {"NodeNames", {"a"}}};
    httplib::Result r = c.Post("/filter", args.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(nlohmann::json::parse(r->body)["NodeNames"], nlohmann::json({"a"})) << r->body;
  }
  write(crt, b->cert_pem);
  write(key, b->key_pem);
  // Not re-read before 5 s have passed since the last check, then at the next handshake.
  EXPECT_TRUE(TrustedBy(service()->port(), a_pem));
  clock_.Advance(absl::Seconds(5));
  EXPECT_TRUE(TrustedBy(service()->port(), b_pem));
  EXPECT_FALSE(TrustedBy(service()->port(), a_pem));
  for (const std::string& f : {crt, key, a_pem, b_pem}) {
    std::remove(f.c_str());
  }
}

}  // namespace
}  // namespace tessera::serve
