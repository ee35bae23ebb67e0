// Scheduler::Refit (the NUMA refit, refit.h) against an in-process apisim over the real HTTP
// client, with the ledger filled directly. Vectors from HAMi refs/pull/2731
// pkg/scheduler/numa_refit_handler_test.go (each test names its HAMi counterpart).
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/accounting/projection.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/extender/refit.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_testutil.h"
#include "tessera/testing/apisim_env.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr const char* kPodPath = kFixturePodPath;
constexpr char kNode[] = "node-1";

struct Card {
  std::string uuid;
  int mem = 40000;
  int numa = 0;
  std::string mode = "hami-core";
  int count = 10;
};

std::string Register(const std::vector<Card>& cards) {
  std::string out = "[";
  for (size_t i = 0; i < cards.size(); ++i) {
    out += fmt::format(
        R"({}{{"id":"{}","index":{},"count":{},"devmem":{},"devcore":100,"type":"NVIDIA-A100",)"
        R"("numa":{},"mode":"{}","health":true}})",
        i == 0 ? "" : ",", cards[i].uuid, i, cards[i].count, cards[i].mem, cards[i].numa,
        cards[i].mode);
  }
  return out + "]";
}

std::string Quoted(const std::string& s) { return nlohmann::json(s).dump(); }

class RefitTest : public SchedulerFixture {
 protected:
  // HAMi's refitFixture: GPU-a (NUMA 1, 40000 MiB) and GPU-b (NUMA 0, `gpu_b_mem`).
  void AddNode(const std::vector<Card>& cards) {
    env_.CreateNode(
        kNode, fmt::format(R"({{"hami.io/node-nvidia-register":{}}})", Quoted(Register(cards))));
    FillLedger(ledger_, {kNode});
  }
  void AddFixtureNode(int gpu_b_mem = 40000) {
    AddNode({{"GPU-a", 40000, 1}, {"GPU-b", gpu_b_mem, 0}});
  }
  // A pod `name` with containers `containers` (app containers), its two allocation
  // annotations, and its record in the ledger (bound to node-1, devices from `allocated`).
  std::string AddPod(const std::string& name, const std::vector<std::string>& containers,
                     const std::string& to_allocate, const std::string& allocated,
                     const std::string& extra_annotations = "") {
    std::string list;
    for (const std::string& c : containers) {
      list += fmt::format(R"({}{{"name":"{}","image":"x"}})", list.empty() ? "" : ",", c);
    }
    env_.Create(
        "pods", "default",
        fmt::format(R"({{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{}",)"
                    R"("namespace":"default","annotations":{{"hami.io/vgpu-node":"{}",)"
                    R"("hami.io/vgpu-devices-to-allocate":{},)"
                    R"("hami.io/vgpu-devices-allocated":{}{}}}}},"spec":{{)"
                    R"("schedulerName":"hami-scheduler","containers":[{}]}}}})",
                    name, kNode, Quoted(to_allocate), Quoted(allocated), extra_annotations, list));
    const kube::Pod pod = Pod(name);
    ledger::PodAllocation record;
    record.uid = pod.meta.uid;
    record.ns = "default";
    record.name = name;
    record.node = kNode;
    record.bound_node = kNode;
    absl::StatusOr<device::PodDevices> devices = device::DecodePodDevices(allocated);
    EXPECT_TRUE(devices.ok()) << devices.status();
    record.devices = devices.ok() ? *devices : device::PodDevices();
    EXPECT_TRUE(ledger_.Apply(record).ok());
    return pod.meta.uid;
  }
  // HAMi's fixture pod: one container "main" reserving GPU-a, 20000 MiB, 30 %.
  std::string AddFixturePod(const std::string& name = "refit-pod") {
    return AddPod(name, {"main"}, "GPU-a,NVIDIA,20000,30:;", "GPU-a,NVIDIA,20000,30:;");
  }
  RefitRequest Request(const std::string& uid, std::vector<std::string> allowed,
                       const std::string& name = "refit-pod") {
    RefitRequest r;
    r.pod_uid = uid;
    r.pod_namespace = "default";
    r.pod_name = name;
    r.node_name = kNode;
    r.device_type = "NVIDIA";
    r.allowed_device_uuids = std::move(allowed);
    return r;
  }
  device::DeviceUsage Usage(size_t card) {
    auto snap = ledger_.Snapshot({kNode});
    return snap[0].has_value() ? snap[0]->usage.at(card) : device::DeviceUsage{-1, -1, -1};
  }
  size_t Patches(const std::string& pod) {
    return env_.faults()->Matching("PATCH", kPodPath + pod).size();
  }
  // A refusal changed nothing: no patch, annotations and ledger as before.
  void ExpectUnchanged(const std::string& pod, const std::string& value) {
    EXPECT_EQ(Patches(pod), 0u);
    EXPECT_EQ(Annotation(pod, device::kDevicesToAllocateAnnotation), value);
    EXPECT_EQ(Annotation(pod, device::kDevicesAllocatedAnnotation), value);
  }
};

// HAMi TestRefitNumaAllocationMovesReservation.
TEST_F(RefitTest, MovesTheContainerPatchesBothAnnotationsAndTheLedger) {
  AddFixtureNode();
  const std::string uid = AddFixturePod();
  Scheduler& s = Make();
  const RefitResponse r = s.Refit(Request(uid, {"GPU-b"}));
  EXPECT_TRUE(r.succeeded) << r.failure_reason;
  EXPECT_EQ(r.container_devices, "GPU-b,NVIDIA,20000,30:");
  EXPECT_EQ(r.failure_reason, "");
  EXPECT_EQ(EncodeRefitResponse(r),
            R"({"succeeded":true,"containerDevices":"GPU-b,NVIDIA,20000,30:"})");
  // One merge patch of both annotations, conditioned on the pod's uid and resourceVersion.
  const std::vector<kube::Request> patches =
      env_.faults()->Matching("PATCH", std::string(kPodPath) + "refit-pod");
  ASSERT_EQ(patches.size(), 1u);
  const nlohmann::json body = nlohmann::json::parse(patches[0].body);
  EXPECT_EQ(body["metadata"]["annotations"].size(), 2u);
  EXPECT_TRUE(body["metadata"].contains("resourceVersion"));
  EXPECT_EQ(body["metadata"]["uid"], uid);
  EXPECT_EQ(Annotation("refit-pod", device::kDevicesToAllocateAnnotation),
            "GPU-b,NVIDIA,20000,30:;");
  EXPECT_EQ(Annotation("refit-pod", device::kDevicesAllocatedAnnotation),
            "GPU-b,NVIDIA,20000,30:;");
  // The ledger moved the usage at once (before the informer sees the patch).
  EXPECT_EQ(Usage(0), (device::DeviceUsage{}));
  EXPECT_EQ(Usage(1), (device::DeviceUsage{1, 20000, 30}));
  const std::vector<SeenEvent> events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, "NumaRefitSucceed");
  EXPECT_EQ(events[0].type, "Normal");
  EXPECT_EQ(events[0].pod, "refit-pod");
  EXPECT_EQ(events[0].message, "NUMA refit moved container 0 from [GPU-a] to [GPU-b]");
}

// HAMi TestRefitNumaAllocationNoOpWhenAlreadyAllowed.
TEST_F(RefitTest, AlreadyInsideTheAllowedSetIsASuccessThatChangesNothing) {
  AddFixtureNode();
  const std::string uid = AddFixturePod();
  Scheduler& s = Make();
  const RefitResponse r = s.Refit(Request(uid, {"GPU-a", "GPU-b"}));
  EXPECT_TRUE(r.succeeded) << r.failure_reason;
  EXPECT_EQ(r.container_devices, "GPU-a,NVIDIA,20000,30:");
  ExpectUnchanged("refit-pod", "GPU-a,NVIDIA,20000,30:;");
  EXPECT_EQ(Usage(0), (device::DeviceUsage{1, 20000, 30}));
  EXPECT_THAT(Events(), IsEmpty());
}

// HAMi TestRefitNumaAllocationInsufficientCapacity.
TEST_F(RefitTest, NoAllowedCardWithRoomIsRefusedWithTheFitReason) {
  AddFixtureNode(16000);
  const std::string uid = AddFixturePod();
  Scheduler& s = Make();
  const RefitResponse r = s.Refit(Request(uid, {"GPU-b"}));
  EXPECT_FALSE(r.succeeded);
  EXPECT_EQ(r.failure_reason, "no allowed device fits: 1/1 CardInsufficientMemory");
  EXPECT_EQ(r.container_devices, "");
  ExpectUnchanged("refit-pod", "GPU-a,NVIDIA,20000,30:;");
  EXPECT_EQ(Usage(0), (device::DeviceUsage{1, 20000, 30}));
  const std::vector<SeenEvent> events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, "NumaRefitFailed");
  EXPECT_EQ(events[0].type, "Warning");
  EXPECT_EQ(events[0].message, r.failure_reason);
}

// HAMi TestRefitNumaAllocationUnmatchedAllowedSet: replica IDs instead of card UUIDs.
TEST_F(RefitTest, AnAllowedSetNamingNoCardOfTheNodeIsUnmatched) {
  AddFixtureNode();
  const std::string uid = AddFixturePod();
  Scheduler& s = Make();
  const RefitResponse r = s.Refit(Request(uid, {"GPU-a-0", "GPU-a-1"}));
  EXPECT_FALSE(r.succeeded);
  EXPECT_EQ(r.failure_reason, "no allowed device fits: AllowedDeviceSetUnmatched");
  ExpectUnchanged("refit-pod", "GPU-a,NVIDIA,20000,30:;");
}

// HAMi TestRefitNumaAllocationPatchFailureLeavesStateUntouched, and the resourceVersion
// precondition: a conflict is a failure, the ledger stays.
TEST_F(RefitTest, APatchFailureOrConflictLeavesTheLedgerAlone) {
  AddFixtureNode();
  const std::string uid = AddFixturePod();
  Scheduler& s = Make();
  env_.faults()->Inject("PATCH", std::string(kPodPath) + "refit-pod", 409, "Conflict");
  RefitResponse r = s.Refit(Request(uid, {"GPU-b"}));
  EXPECT_FALSE(r.succeeded);
  EXPECT_THAT(r.failure_reason, HasSubstr("cannot patch pod annotations: "));
  EXPECT_EQ(Usage(0), (device::DeviceUsage{1, 20000, 30}));
  EXPECT_EQ(Usage(1), (device::DeviceUsage{}));
  EXPECT_EQ(Annotation("refit-pod", device::kDevicesAllocatedAnnotation),
            "GPU-a,NVIDIA,20000,30:;");
  env_.faults()->Inject("PATCH", std::string(kPodPath) + "refit-pod", 500, "InternalError");
  r = s.Refit(Request(uid, {"GPU-b"}));
  EXPECT_FALSE(r.succeeded);
  EXPECT_THAT(r.failure_reason, HasSubstr("cannot patch pod annotations: "));
  EXPECT_EQ(Usage(0), (device::DeviceUsage{1, 20000, 30}));
}

// HAMi TestRefitNumaAllocationConsumedAllocation.
TEST_F(RefitTest, AContainerThePluginAlreadyConsumedIsRefused) {
  AddFixtureNode();
  const std::string uid = AddPod("refit-pod", {"main"}, ";", "GPU-a,NVIDIA,20000,30:;");
  Scheduler& s = Make();
  const RefitResponse r = s.Refit(Request(uid, {"GPU-b"}));
  EXPECT_FALSE(r.succeeded);
  EXPECT_EQ(r.failure_reason, "container 0 has no pending NVIDIA allocation to refit");
  EXPECT_EQ(Patches("refit-pod"), 0u);
}

TEST_F(RefitTest, AContainerWithoutARecordedAllocationIsRefused) {
  AddFixtureNode();
  const std::string uid = AddPod("refit-pod", {"main", "side"},
                                 "GPU-a,NVIDIA,1,1:;GPU-a,NVIDIA,1,1:;", "GPU-a,NVIDIA,1,1:;;");
  Scheduler& s = Make();
  RefitRequest req = Request(uid, {"GPU-b"});
  req.container_index = 1;
  EXPECT_EQ(s.Refit(req).failure_reason, "container 1 has no recorded NVIDIA allocation");
}

// HAMi TestRefitNumaAllocationValidation: the request alone; no event (the pod is not known).
TEST_F(RefitTest, InvalidRequestsAreRefusedWithHamisTexts) {
  AddFixtureNode();
  const std::string uid = AddFixturePod();
  Scheduler& s = Make();
  const std::string incomplete =
      "incomplete refit request: pod UID, namespace, name, and node are required";
  std::vector<std::pair<RefitRequest, std::string>> cases;
  for (int field = 0; field < 4; ++field) {
    RefitRequest r = Request(uid, {"GPU-b"});
    (field == 0   ? r.pod_uid
     : field == 1 ? r.pod_namespace
     : field == 2 ? r.pod_name
                  : r.node_name)
        .clear();
    cases.emplace_back(r, incomplete);
  }
  cases.emplace_back(Request(uid, {}), "refit request carries an empty allowed device set");
  cases.emplace_back(Request(uid, std::vector<std::string>(513, "GPU-b")),
                     "refit request carries 513 allowed devices, limit is 512");
  RefitRequest other_type = Request(uid, {"GPU-b"});
  other_type.device_type = "MLU";
  cases.emplace_back(other_type, "unknown device type \"MLU\"");
  cases.emplace_back(Request("no-such-uid", {"GPU-b"}),
                     "pod no-such-uid is not tracked by the scheduler");
  cases.emplace_back(Request(uid, {"GPU-b"}, "another-name"),
                     fmt::format("pod {} does not match default/another-name", uid));
  for (const auto& [req, want] : cases) {
    SCOPED_TRACE(want);
    const RefitResponse r = s.Refit(req);
    EXPECT_FALSE(r.succeeded);
    EXPECT_EQ(r.failure_reason, want);
  }
  // 512 is allowed.
  EXPECT_TRUE(s.Refit(Request(uid, std::vector<std::string>(512, "GPU-a"))).succeeded);
  ExpectUnchanged("refit-pod", "GPU-a,NVIDIA,20000,30:;");
  EXPECT_THAT(Events(), IsEmpty());
}

// Once the pod is known every refusal is also a NumaRefitFailed event on it.
TEST_F(RefitTest, RefusalsAboutAKnownPodAreRecordedAsEvents) {
  AddFixtureNode();
  const std::string uid = AddFixturePod();
  Scheduler& s = Make();
  RefitRequest wrong_node = Request(uid, {"GPU-b"});
  wrong_node.node_name = "node-2";
  RefitRequest outside = Request(uid, {"GPU-b"});
  outside.container_index = 1;
  RefitRequest negative = Request(uid, {"GPU-b"});
  negative.container_index = -1;
  // HAMi TestRefitNumaAllocationContainerNameMismatch.
  RefitRequest other_name = Request(uid, {"GPU-b"});
  other_name.container_name = "sidecar";
  const std::vector<std::pair<RefitRequest, std::string>> cases = {
      {wrong_node, "pod default/refit-pod is tracked on node node-1, not node-2"},
      {outside, "container index 1 is outside the pod's containers"},
      {negative, "container index -1 is outside the pod's containers"},
      {other_name, R"(container index 0 is "main", not "sidecar")"},
  };
  std::vector<std::string> messages;
  for (const auto& [req, want] : cases) {
    SCOPED_TRACE(want);
    const RefitResponse r = s.Refit(req);
    EXPECT_FALSE(r.succeeded);
    EXPECT_EQ(r.failure_reason, want);
    messages.push_back(want);
  }
  ExpectUnchanged("refit-pod", "GPU-a,NVIDIA,20000,30:;");
  std::vector<std::string> seen;
  for (const SeenEvent& e : Events()) {
    EXPECT_EQ(e.reason, "NumaRefitFailed");
    EXPECT_EQ(e.type, "Warning");
    seen.push_back(e.message);
  }
  EXPECT_THAT(seen, ::testing::UnorderedElementsAreArray(messages));
  // The matching name is accepted.
  RefitRequest same_name = Request(uid, {"GPU-b"});
  same_name.container_name = "main";
  EXPECT_TRUE(s.Refit(same_name).succeeded);
}

// HAMi TestRefitNumaAllocationRejectsMigDevice.
TEST_F(RefitTest, AnAllowedMigCardIsRefused) {
  AddNode({{"GPU-a", 40000, 1}, {"GPU-b", 40000, 0, "mig", 7}});
  const std::string uid = AddFixturePod();
  Scheduler& s = Make();
  EXPECT_EQ(s.Refit(Request(uid, {"GPU-b"})).failure_reason,
            "allowed device GPU-b is in MIG mode; the NUMA refit does not support MIG");
  ExpectUnchanged("refit-pod", "GPU-a,NVIDIA,20000,30:;");
}

// HAMi TestRefitNumaAllocationHeterogeneousReservation.
TEST_F(RefitTest, DifferingAmountsPerCardAreRefused) {
  AddNode({{"GPU-a", 40000, 1}, {"GPU-b", 40000, 0}, {"GPU-c", 40000, 0}});
  const std::string value = "GPU-a,NVIDIA,20000,30:GPU-b,NVIDIA,10000,30:;";
  const std::string uid = AddPod("refit-pod", {"main"}, value, value);
  Scheduler& s = Make();
  EXPECT_EQ(s.Refit(Request(uid, {"GPU-c"})).failure_reason,
            "container 0 reserves differing amounts per device; the refit does not support "
            "heterogeneous reservations");
  ExpectUnchanged("refit-pod", value);
}

// HAMi TestRefitNumaAllocationSeedsExistingAllocations: container 0 consumed its entry; only
// container 1's segments change, every other byte stays.
TEST_F(RefitTest, OnlyThatContainersSegmentChangesByteForByte) {
  AddFixtureNode();
  const std::string uid = AddPod("refit-pod", {"first", "second"}, ";GPU-a,NVIDIA,20000,30:;",
                                 "GPU-a,NVIDIA,5000,10:;GPU-a,NVIDIA,20000,30:;");
  Scheduler& s = Make();
  RefitRequest req = Request(uid, {"GPU-b"});
  req.container_index = 1;
  req.container_name = "second";
  const RefitResponse r = s.Refit(req);
  ASSERT_TRUE(r.succeeded) << r.failure_reason;
  EXPECT_EQ(Annotation("refit-pod", device::kDevicesToAllocateAnnotation),
            ";GPU-b,NVIDIA,20000,30:;");
  EXPECT_EQ(Annotation("refit-pod", device::kDevicesAllocatedAnnotation),
            "GPU-a,NVIDIA,5000,10:;GPU-b,NVIDIA,20000,30:;");
  EXPECT_EQ(Usage(0), (device::DeviceUsage{1, 5000, 10}));
  EXPECT_EQ(Usage(1), (device::DeviceUsage{1, 20000, 30}));
}

// The container's own reservation does not count against it: two cards of 40000, the
// container holds 30000 on each; GPU-a leaves the allowed set, so GPU-b (own 30000 taken off)
// and GPU-c are chosen. Counting itself, GPU-b would have 10000 free and fail.
TEST_F(RefitTest, TheContainersOwnReservationIsTakenOffTheNode) {
  AddNode({{"GPU-a", 40000, 1}, {"GPU-b", 40000, 0}, {"GPU-c", 40000, 0}});
  const std::string value = "GPU-a,NVIDIA,30000,10:GPU-b,NVIDIA,30000,10:;";
  const std::string uid = AddPod("refit-pod", {"main"}, value, value);
  Scheduler& s = Make();
  const RefitResponse r = s.Refit(Request(uid, {"GPU-b", "GPU-c"}));
  ASSERT_TRUE(r.succeeded) << r.failure_reason;
  const absl::StatusOr<device::PodDevices> got =
      device::DecodePodDevices(Annotation("refit-pod", device::kDevicesAllocatedAnnotation));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 1u);
  std::vector<std::string> uuids;
  for (const device::ContainerDevice& d : (*got)[0]) {
    uuids.push_back(d.uuid);
    EXPECT_EQ(d.usedmem, 30000);
  }
  EXPECT_THAT(uuids, ::testing::UnorderedElementsAre("GPU-b", "GPU-c"));
  EXPECT_EQ(Usage(0), (device::DeviceUsage{}));
  EXPECT_EQ(Usage(1), (device::DeviceUsage{1, 30000, 10}));
  EXPECT_EQ(Usage(2), (device::DeviceUsage{1, 30000, 10}));
}

// The pod's other containers stay counted: container 0 holds 25000 on GPU-b, so container 1's
// 20000 does not fit there (40000).
TEST_F(RefitTest, ThePodsOtherContainersStayCounted) {
  AddFixtureNode();
  const std::string uid = AddPod("refit-pod", {"first", "second"}, ";GPU-a,NVIDIA,20000,30:;",
                                 "GPU-b,NVIDIA,25000,10:;GPU-a,NVIDIA,20000,30:;");
  Scheduler& s = Make();
  RefitRequest req = Request(uid, {"GPU-b"});
  req.container_index = 1;
  EXPECT_EQ(s.Refit(req).failure_reason, "no allowed device fits: 1/1 CardInsufficientMemory");
}

// HAMi TestRefitNumaAllocationCompetingRefits: GPU-b has room for one of two.
TEST_F(RefitTest, CompetingRefitsTakeTheRoomOnce) {
  AddFixtureNode(20000);
  const std::string v = "GPU-a,NVIDIA,15000,10:;";
  const std::string uid1 = AddPod("pod-1", {"main"}, v, v);
  const std::string uid2 = AddPod("pod-2", {"main"}, v, v);
  Scheduler& s = Make();
  std::atomic<int> won{0};
  std::vector<std::thread> threads;
  for (const auto& [uid, name] : {std::pair{uid1, "pod-1"}, std::pair{uid2, "pod-2"}}) {
    threads.emplace_back([&, uid = uid, name = std::string(name)] {
      const RefitResponse r = s.Refit(Request(uid, {"GPU-b"}, name));
      if (r.succeeded) {
        ++won;
      } else {
        EXPECT_EQ(r.failure_reason, "no allowed device fits: 1/1 CardInsufficientMemory");
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(Usage(0), (device::DeviceUsage{1, 15000, 10}));
  EXPECT_EQ(Usage(1), (device::DeviceUsage{1, 15000, 10}));
}

// Refit and /filter decide under the same lock: a filter racing a refit for GPU-b's last room
// never books more than the card has.
TEST_F(RefitTest, RefitAndFilterNeverOverbookACard) {
  AddNode({{"GPU-a", 40000, 1}, {"GPU-b", 20000, 0}});
  const std::string v = "GPU-a,NVIDIA,15000,10:;";
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    const std::string name = fmt::format("refit-{}", round);
    const std::string uid = AddPod(name, {"main"}, v, v);
    const std::string other = fmt::format("filter-{}", round);
    env_.CreatePod(other, R"({"nvidia.com/gpu":"1","nvidia.com/gpumem":"15000"})",
                   R"({"nvidia.com/use-gpuuuid":"GPU-b"})");
    Scheduler& s = Make();
    FilterArgs args;
    args.pod = Pod(other);
    args.node_names = std::vector<std::string>{kNode};
    std::thread filter([&] { s.Filter(args); });
    const RefitResponse r = s.Refit(Request(uid, {"GPU-b"}, name));
    filter.join();
    EXPECT_LE(Usage(1).usedmem, 20000);
    // Clean up for the next round: both pods gone from the ledger.
    ledger_.Remove(uid);
    ledger_.Remove(args.pod.meta.uid);
    (void)r;
  }
}

}  // namespace
}  // namespace tessera::extender
