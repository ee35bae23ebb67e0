// Scheduler::Bind against an in-process apisim over the real HTTP client, with the ledger filled
// directly: the node lock, the devices re-check, the Binding, refusals and the reservations a bind
// keeps or ends.
#include <atomic>
#include <barrier>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/accounting/projection.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/mig.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_test_fixture.h"
#include "tessera/ledger/ledger.h"
#include "tessera/testing/objects.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// ---- bind ---------------------------------------------------------------------------------

TEST_F(SchedulerTest, BindTakesTheLockMarksThePhaseAndPostsTheBinding) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  clock_.Advance(absl::Seconds(3));
  const size_t patches = PodPatches("p1").size();
  BindOutcome outcome;
  BindResult b = s.Bind(BindFor("p1", "n1"), &outcome);
  EXPECT_EQ(b.error, "");
  // bind-phase and bind-time travel in the Binding: no pod PATCH of its own.
  EXPECT_EQ(PodPatches("p1").size(), patches);
  std::vector<kube::Request> bindings =
      env_.faults()->Matching("POST", std::string(kPodPath) + "p1/binding");
  ASSERT_EQ(bindings.size(), 1u);
  EXPECT_THAT(bindings[0].body, HasSubstr(R"("hami.io/bind-phase":"allocating")"));
  const kube::Pod pod = Pod("p1");
  EXPECT_EQ(pod.node_name, "n1");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/bind-phase"), "allocating");
  EXPECT_EQ(pod.meta.annotations.Get("hami.io/bind-time"), "1767225603");
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:03Z,default,p1");
  // Held until the ledger observes the pod bound.
  ASSERT_EQ(ledger_.Reservations().size(), 1u);
  std::vector<SeenEvent> events = Events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].reason, "BindingSucceed");
  EXPECT_EQ(events[1].message, "Successfully binding node [n1] to default/p1");
  EXPECT_EQ(outcome.code, BindCode::kBound);
  EXPECT_EQ(outcome.lock, NodeLockOutcome::kAcquired);
  EXPECT_EQ(outcome.lock_conflicts, 0);
  EXPECT_FALSE(outcome.lock_wait);
}

TEST_F(SchedulerTest, BindUsesTheLookupAndFallsBackToTheApiWhenItsCopyIsStale) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  const kube::Pod unannotated = Pod("p1");  // the informer has not seen the filter's patch yet
  std::atomic<int> lookups{0};
  Scheduler& s = Make([&](std::string_view, std::string_view name) -> std::optional<kube::Pod> {
    ++lookups;
    if (name == "p1") {
      return unannotated;
    }
    return std::nullopt;
  });
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  env_.faults()->Clear();
  EXPECT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  EXPECT_GE(lookups.load(), 1);
  EXPECT_EQ(Pod("p1").node_name, "n1");
}

TEST_F(SchedulerTest, BindFailsWhenALivePodHoldsTheLock) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("holder", Limits(1000));
  env_.CreatePod("p1", Limits(1000));
  SetLock("n1", "2025-12-31T23:58:00Z,default,holder");
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  BindOutcome outcome;
  BindResult b = s.Bind(BindFor("p1", "n1"), &outcome);
  EXPECT_THAT(b.error, HasSubstr("locked by default/holder"));
  EXPECT_EQ(Lock("n1"), "2025-12-31T23:58:00Z,default,holder");
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  kube::Pod p = Pod("p1");
  EXPECT_EQ(p.node_name, "");
  EXPECT_FALSE(p.meta.annotations.Contains("hami.io/bind-phase"));
  EXPECT_THAT(EventReasons(), ElementsAre("FilteringSucceed", "BindingFailed"));
  EXPECT_EQ(outcome.code, BindCode::kLockHeld);
}

TEST_F(SchedulerTest, BindTakesOverALockOlderThanTheTimeout) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("holder", Limits(1000));
  env_.CreatePod("p1", Limits(1000));
  SetLock("n1", "2025-12-31T23:54:00Z,default,holder");
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  BindOutcome outcome;
  EXPECT_EQ(s.Bind(BindFor("p1", "n1"), &outcome).error, "");
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
  EXPECT_EQ(outcome.lock, NodeLockOutcome::kTookOverExpired);
}

TEST_F(SchedulerTest, BindTakesOverALockWhoseOwnerIsGone) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  SetLock("n1", "2025-12-31T23:59:59Z,default,ghost");
  // The lookup misses the ghost too, so the API is asked (404).
  Scheduler& s = Make([](std::string_view, std::string_view) { return std::nullopt; });
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  BindOutcome outcome;
  EXPECT_EQ(s.Bind(BindFor("p1", "n1"), &outcome).error, "");
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
  EXPECT_EQ(outcome.lock, NodeLockOutcome::kTookOverOrphan);
}

TEST_F(SchedulerTest, BindIsReentrantForTheLockOwner) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  SetLock("n1", "2025-12-31T23:59:00Z,default,p1");
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  BindOutcome outcome;
  EXPECT_EQ(s.Bind(BindFor("p1", "n1"), &outcome).error, "");
  EXPECT_EQ(Lock("n1"), "2025-12-31T23:59:00Z,default,p1");
  EXPECT_EQ(Pod("p1").node_name, "n1");
  EXPECT_EQ(outcome.lock, NodeLockOutcome::kReentered);
}

TEST_F(SchedulerTest, BindFailsWhenTheDevicesAreNoLongerFree) {
  AddNode("n1", {{"GPU-a", 10, 8000}});
  env_.CreatePod("p1", Limits(6000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  // Another scheduler's pod lands on the same GPU before the bind.
  ASSERT_TRUE(ledger_
                  .Apply({"intruder",
                          "default",
                          "intruder",
                          "n1",
                          "n1",
                          false,
                          false,
                          false,
                          {{{"GPU-a", "NVIDIA", 4000, 0}}},
                          0})
                  .ok());
  BindOutcome outcome;
  BindResult b = s.Bind(BindFor("p1", "n1"), &outcome);
  EXPECT_THAT(b.error, HasSubstr("no longer free"));
  EXPECT_THAT(b.error, HasSubstr("10000/8000 MiB"));
  ExpectNothingHeld("p1", "n1");
  EXPECT_EQ(outcome.code, BindCode::kDevicesNotFree);
}

// A mig card's instances book their profile's core rounded up (1g.5gb: 15 %), so seven 1g
// instances book 105 % of a card whose devcore is 100. The fit places the seventh (its cores
// check is the request's, as HAMi's), and the bind's re-check must not refuse what the fit
// placed: the card's bound is its placements (`tessera simulate --scenario mig` saw such binds
// refused in a loop on every full A100 and H100 card).
TEST_F(SchedulerTest, TheSeventhInstanceOnAMigCardIsBound) {
  const std::string reg =
      device::EncodeNodeRegisterJson(::tessera::testing::MigNodeDevices("m1", {"GPU-m0"})->devices);
  env_.CreateNode("m1", fmt::format(R"({{"hami.io/node-nvidia-register":"{}"}})", Escape(reg)));
  FillLedger(ledger_, {"m1"});
  for (uint32_t i = 0; i < 6; ++i) {
    ledger::PodAllocation held;
    held.uid = held.name = fmt::format("r{}", i);
    held.ns = "default";
    held.node = held.bound_node = "m1";
    held.devices = {{device::ContainerDevice{"GPU-m0", "NVIDIA", 4864, 15}}};
    device::MigAllocation a;
    a.gpu_uuid = "GPU-m0";
    a.profile = "1g.5gb";
    a.placement = {i, 1};
    held.mig = {a};
    ASSERT_TRUE(ledger_.Apply(held).ok());
  }
  env_.CreatePod("p1", Limits(4000), R"({"nvidia.com/vgpu-mode":"mig"})");
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"m1"})).node_names, ElementsAre("m1"));
  EXPECT_THAT(std::string(Pod("p1").meta.annotations.Get("hami.io/vgpu-mig-allocations")),
              HasSubstr(R"("profile":"1g.5gb","placement":{"start":6,"size":1})"));
  BindOutcome outcome;
  EXPECT_EQ(s.Bind(BindFor("p1", "m1"), &outcome).error, "");
  EXPECT_EQ(outcome.code, BindCode::kBound);
  EXPECT_EQ(Pod("p1").node_name, "m1");
  // An eighth is refused by the fit (no slot, no placement left), as HAMi refuses it.
  env_.CreatePod("p2", Limits(4000), R"({"nvidia.com/vgpu-mode":"mig"})");
  ClearLock("m1");
  FilterResult f = s.Filter(Args("p2", {"m1"}));
  EXPECT_TRUE(f.failed_nodes.contains("m1")) << f.error;
}

// Issue #41 finding 2: the allocation a bind hands to the device plugin is the filter's
// decision. A pod whose allocation annotations were rewritten between filter and bind (to
// 1 MiB, say, which the plugin would then grant while the ledger held 12,000) is not bound.
TEST_F(SchedulerTest, ABindRefusesAnAllocationRewrittenSinceTheFilter) {
  AddNode("n1", {{"GPU-a", 10, 16000}});
  env_.CreatePod("p1", Limits(12000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  const std::string decided = Annotation("p1", device::kDevicesAllocatedAnnotation);
  for (std::string_view key :
       {device::kDevicesAllocatedAnnotation, device::kDevicesToAllocateAnnotation}) {
    SCOPED_TRACE(key);
    ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
    kube::MetadataPatch patch;
    patch.annotations.emplace_back(std::string(key), "GPU-a,NVIDIA,1,0:;");
    ASSERT_TRUE(env_.client()->PatchPodMetadata("default", "p1", patch).ok());
    BindOutcome outcome;
    BindResult b = s.Bind(BindFor("p1", "n1"), &outcome);
    EXPECT_THAT(b.error, HasSubstr("changed since the filter decided"));
    EXPECT_THAT(b.error, HasSubstr(std::string(key)));
    EXPECT_EQ(outcome.code, BindCode::kNoAllocation);
    ASSERT_EQ(Pod("p1").node_name, "") << "bound with the rewritten allocation";
    ExpectNothingHeld("p1", "n1");
    kube::MetadataPatch back;
    back.annotations.emplace_back(std::string(key), decided);
    ASSERT_TRUE(env_.client()->PatchPodMetadata("default", "p1", back).ok());
  }
  // As decided: bound.
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  EXPECT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
}

// Issue #41 finding 6: a MIG placement written between filter and bind onto an instance in use
// is not bound. The pod's own card keeps its placement; an extra entry names the other card's
// slice 6, where r0 runs (HAMi's usage rebuild adds a left-over entry to the card it names).
TEST_F(SchedulerTest, ABindRefusesAMigPlacementRewrittenOntoAnInstanceInUse) {
  const std::string reg = device::EncodeNodeRegisterJson(
      ::tessera::testing::MigNodeDevices("m1", {"GPU-m0", "GPU-m1"})->devices);
  env_.CreateNode("m1", fmt::format(R"({{"hami.io/node-nvidia-register":"{}"}})", Escape(reg)));
  FillLedger(ledger_, {"m1"});
  ledger::PodAllocation held;
  held.uid = held.name = "r0";
  held.ns = "default";
  held.node = held.bound_node = "m1";
  held.devices = {{device::ContainerDevice{"GPU-m1", "NVIDIA", 4864, 15}}};
  device::MigAllocation in_use;
  in_use.gpu_uuid = "GPU-m1";
  in_use.profile = "1g.5gb";
  in_use.placement = {6, 1};
  held.mig = {in_use};
  ASSERT_TRUE(ledger_.Apply(held).ok());
  env_.CreatePod("p1", Limits(4000), R"({"nvidia.com/vgpu-mode":"mig"})");
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"m1"})).node_names, ElementsAre("m1"));
  const std::string placed = Annotation("p1", device::kMigAllocationsAnnotation);
  ASSERT_THAT(placed, HasSubstr(R"("gpuUUID":"GPU-m0")"));
  std::string extra = placed;
  extra.insert(extra.size() - 1,
               R"(,{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-m1","profile":"1g.5gb",)"
               R"("placement":{"start":6,"size":1}})");
  kube::MetadataPatch patch;
  patch.annotations.emplace_back(std::string(device::kMigAllocationsAnnotation), extra);
  ASSERT_TRUE(env_.client()->PatchPodMetadata("default", "p1", patch).ok());
  BindOutcome outcome;
  BindResult b = s.Bind(BindFor("p1", "m1"), &outcome);
  EXPECT_THAT(b.error, HasSubstr("changed since the filter decided"));
  EXPECT_EQ(outcome.code, BindCode::kNoAllocation);
  ASSERT_EQ(Pod("p1").node_name, "") << "bound onto r0's instance";
  ExpectNothingHeld("p1", "m1");

  // Without the filter's reservation (it expired), the bind's re-check still refuses the
  // overlap on the card the extra entry names.
  ASSERT_THAT(*s.Filter(Args("p1", {"m1"})).node_names, ElementsAre("m1"));
  ASSERT_TRUE(env_.client()->PatchPodMetadata("default", "p1", patch).ok());
  clock_.Advance(absl::Minutes(6));
  ASSERT_EQ(s.ExpireReservations(clock_.Now()).size(), 1u);
  b = s.Bind(BindFor("p1", "m1"), &outcome);
  EXPECT_THAT(b.error, HasSubstr("device GPU-m1 on node m1: MIG placements slices 6-6 and 6-6 "
                                 "overlap"));
  EXPECT_EQ(outcome.code, BindCode::kDevicesNotFree);
  ExpectNothingHeld("p1", "m1");
}

TEST_F(SchedulerTest, BindRejectedBecauseThePodIsAlreadyBound) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  const BindArgs args = BindFor("p1", "n1");
  ASSERT_TRUE(env_.client()->BindPod("default", "p1", args.pod_uid, "n1").ok());
  const size_t writes = env_.faults()->requests().size();
  BindOutcome outcome;
  BindResult b = s.Bind(args, &outcome);
  EXPECT_THAT(b.error, HasSubstr("pod default/p1 is already assigned to node n1"));
  // A refusal: the devices of the bound pod stay held until the ledger observes it, and no
  // lock or binding is attempted (only the pod's GET).
  EXPECT_EQ(ledger_.Reservations().size(), 1u);
  EXPECT_EQ(Lock("n1"), "<none>");
  const std::vector<kube::Request> requests = env_.faults()->requests();
  for (size_t i = writes; i < requests.size(); ++i) {
    if (requests[i].path != "/api/v1/namespaces/default/events") {
      EXPECT_EQ(requests[i].method, "GET") << requests[i].path;
    }
  }
  EXPECT_EQ(outcome.code, BindCode::kBindingRejected);
}

// A binding refused because the pod is bound already (a duplicate bind racing the informer)
// released the reservation of a pod that runs on those devices: until the informer saw the
// binding, the next filter could place another pod on the same share.
TEST_F(SchedulerTest, ABindingRefusedBecauseThePodIsBoundKeepsItsDevicesHeld) {
  AddNode("n1", {{"GPU-a", 1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  env_.CreatePod("p2", Limits(8000));
  kube::Pod cached;
  Scheduler& s = Make([&](std::string_view, std::string_view name) -> std::optional<kube::Pod> {
    if (name == "p1") {
      return cached;
    }
    return std::nullopt;
  });
  cached = Pod("p1");
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  cached = Pod("p1");  // annotated and unbound: the informer has not seen the first binding
  const BindArgs args = BindFor("p1", "n1");
  ASSERT_TRUE(env_.client()->BindPod("default", "p1", args.pod_uid, "n1").ok());
  BindResult b = s.Bind(args);
  EXPECT_THAT(b.error, HasSubstr("already assigned"));
  EXPECT_EQ(ledger_.Reservations().size(), 1u);
  EXPECT_THAT(*s.Filter(Args("p2", {"n1"})).node_names, IsEmpty()) << "p2 placed on p1's share";
  // Expiry keeps it as for an accepted binding, until the informer observes the pod.
  clock_.Advance(absl::Minutes(6));
  EXPECT_THAT(s.ExpireReservations(clock_.Now()), IsEmpty());
}

TEST_F(SchedulerTest, ADuplicateBindThatFailsLeavesTheFirstBindsLock) {
  // kube-scheduler sends /bind again (its first call timed out, say) while the first bind's
  // lock still waits for the device plugin. The second finds the lock already the pod's, so it
  // did not take it and must not remove it when its own Binding is refused.
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  // The informer has the filter's annotations but not yet the binding, so the duplicate gets
  // as far as the lock and the Binding.
  kube::Pod cached;
  Scheduler& s = Make([&](std::string_view, std::string_view name) -> std::optional<kube::Pod> {
    if (name == "p1" && !cached.meta.uid.empty()) {
      return cached;
    }
    return std::nullopt;
  });
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  cached = Pod("p1");
  const BindArgs args = BindFor("p1", "n1");
  BindOutcome first;
  ASSERT_EQ(s.Bind(args, &first).error, "");
  EXPECT_EQ(first.lock, NodeLockOutcome::kAcquired);
  ASSERT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
  clock_.Advance(absl::Seconds(2));
  BindOutcome outcome;
  BindResult again = s.Bind(args, &outcome);
  EXPECT_THAT(again.error, HasSubstr("already assigned"));
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
  EXPECT_EQ(outcome.lock, NodeLockOutcome::kReentered);
  // Nor does it drop the reservation that holds the pod's devices until it is observed bound.
  EXPECT_EQ(ledger_.Reservations().size(), 1u);
}

// A duplicate that arrives while the first bind of the pod is still in progress is refused at
// once: it cannot take part in the first one's lock, re-check or binding, nor undo them.
TEST_F(SchedulerTest, ABindOfAPodWhoseBindIsInProgressIsRefusedAtOnce) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler* s = nullptr;
  BindResult nested;
  BindOutcome nested_outcome;
  const BindArgs args{"p1", "default", "", "n1"};
  bool once = false;
  s = &Make([&](std::string_view, std::string_view name) -> std::optional<kube::Pod> {
    if (name == "p1" && !once && s != nullptr && !ledger_.Reservations().empty()) {
      once = true;  // inside the first Bind: the duplicate arrives now
      nested = s->Bind(args, &nested_outcome);
    }
    return std::nullopt;
  });
  ASSERT_THAT(*s->Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_FALSE(once);
  BindOutcome outcome;
  EXPECT_EQ(s->Bind(args, &outcome).error, "");
  EXPECT_EQ(outcome.code, BindCode::kBound);
  ASSERT_TRUE(once);
  EXPECT_EQ(nested_outcome.code, BindCode::kInProgress);
  EXPECT_THAT(nested.error, HasSubstr("a bind of pod default/p1 is already in progress"));
  EXPECT_EQ(Pod("p1").node_name, "n1");
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
  EXPECT_EQ(ledger_.Reservations().size(), 1u);
  // The duplicate posted no binding of its own.
  EXPECT_EQ(env_.faults()->Matching("POST", std::string(kPodPath) + "p1/binding").size(), 1u);
  // Afterwards the pod can be bound again (the guard is gone): it is refused as bound.
  EXPECT_THAT(s->Bind(args).error, HasSubstr("already assigned"));
}

TEST_F(SchedulerTest, AnExpiredLockIsNotHandedOverWhileItsHolderWaitsForAllocate) {
  // HAMi PR #3097: the device plugin finds the pod it allocates through the lock; handing an
  // expired lock to the next pod while the holder still waits for Allocate gave two pods each
  // other's memory limits.
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("holder", Limits(1000));
  env_.CreatePod("p1", Limits(1000));
  ASSERT_TRUE(env_.client()
                  ->BindPod("default", "holder", Pod("holder").meta.uid, "n1",
                            {{std::string(device::kBindPhaseAnnotation), "allocating"}})
                  .ok());
  SetLock("n1", "2025-12-31T23:54:00Z,default,holder");  // 6 min old
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  BindOutcome outcome;
  BindResult b = s.Bind(BindFor("p1", "n1"), &outcome);
  EXPECT_THAT(b.error, HasSubstr("default/holder is still waiting for the device plugin's "
                                 "Allocate"));
  EXPECT_EQ(Lock("n1"), "2025-12-31T23:54:00Z,default,holder");
  EXPECT_EQ(Pod("p1").node_name, "");
  EXPECT_EQ(outcome.code, BindCode::kLockHeld);
  // Once the plugin is done (bind-phase success), the expired lock is free.
  kube::MetadataPatch done;
  done.annotations.emplace_back(std::string(device::kBindPhaseAnnotation), "success");
  ASSERT_TRUE(env_.client()->PatchPodMetadata("default", "holder", done).ok());
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  EXPECT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
}

TEST_F(SchedulerTest, ALockHeldByAFinishedPodIsFreeAtOnce) {
  // HAMi PR #3047: a Succeeded or Failed holder will never be allocated; its young lock is free.
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("holder", Limits(1000));
  env_.CreatePod("p1", Limits(1000));
  ASSERT_TRUE(env_.store()
                  .Patch(*apisim::FindResource("", "v1", "pods"), "default", "holder", "status",
                         apisim::PatchType::kMerge, R"({"status":{"phase":"Succeeded"}})")
                  .ok());
  SetLock("n1", "2025-12-31T23:59:00Z,default,holder");  // 1 min old
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  EXPECT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
}

TEST_F(SchedulerTest, ABindThatMeetsAHeldLockWaitsForItsRelease) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("holder", Limits(1000));
  env_.CreatePod("p1", Limits(1000));
  SetLock("n1", "2026-01-01T00:00:00Z,default,holder");
  options_.node_lock_retry_timeout = absl::Seconds(28);
  int pauses = 0;
  options_.lock.sleep = [&](absl::Duration d) {
    clock_.Advance(d);
    if (++pauses == 3) {  // the holder's device plugin is done
      kube::MetadataPatch release;
      release.annotations.emplace_back(std::string(device::kNodeLockAnnotation), std::nullopt);
      ASSERT_TRUE(env_.client()->PatchNodeMetadata("n1", release).ok());
    }
  };
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  const absl::Time start = clock_.Now();
  BindOutcome waited;
  EXPECT_EQ(s.Bind(BindFor("p1", "n1"), &waited).error, "");
  EXPECT_EQ(Pod("p1").node_name, "n1");
  EXPECT_EQ(Lock("n1"), device::FormatNodeLock(clock_.Now(), "default", "p1"));
  EXPECT_EQ(waited.code, BindCode::kBound);
  EXPECT_TRUE(waited.lock_wait);
  EXPECT_NEAR(absl::ToDoubleSeconds(waited.lock_waited),
              absl::ToDoubleSeconds(clock_.Now() - start), 1e-9);
  // A holder that never lets go: the bind gives up after the retry timeout and says so.
  env_.CreatePod("p2", Limits(1000));
  AddNode("n2", {{"GPU-b"}});
  SetLock("n2", device::FormatNodeLock(clock_.Now(), "default", "holder"));
  ASSERT_THAT(*s.Filter(Args("p2", {"n2"})).node_names, ElementsAre("n2"));
  BindOutcome outcome;
  BindResult b = s.Bind(BindFor("p2", "n2"), &outcome);
  EXPECT_THAT(b.error, HasSubstr("locked by default/holder"));
  EXPECT_THAT(b.error, HasSubstr("gave up after waiting 28s"));
  EXPECT_TRUE(outcome.lock_wait);  // it waited, and timed out
  EXPECT_EQ(outcome.code, BindCode::kLockHeld);
}

TEST_F(SchedulerTest, OnlyMaxLockWaitersBindsWaitAtOnce) {
  AddNode("n1", {{"GPU-a"}});
  AddNode("n2", {{"GPU-b"}});
  env_.CreatePod("holder", Limits(1000));
  env_.CreatePod("p1", Limits(1000));
  env_.CreatePod("p2", Limits(1000));
  SetLock("n1", "2026-01-01T00:00:00Z,default,holder");
  SetLock("n2", "2026-01-01T00:00:00Z,default,holder");
  options_.node_lock_retry_timeout = absl::Seconds(28);
  options_.max_lock_waiters = 1;
  Scheduler* s = nullptr;
  BindResult second;
  int pauses = 0;
  // While p1 waits for n1 (its first pause), p2's bind meets n2's lock: it may not wait.
  options_.lock.sleep = [&](absl::Duration d) {
    clock_.Advance(d);
    if (++pauses == 1) {
      second = s->Bind(BindFor("p2", "n2"));
      kube::MetadataPatch release;
      release.annotations.emplace_back(std::string(device::kNodeLockAnnotation), std::nullopt);
      ASSERT_TRUE(env_.client()->PatchNodeMetadata("n1", release).ok());
    }
  };
  s = &Make();
  ASSERT_THAT(*s->Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_THAT(*s->Filter(Args("p2", {"n2"})).node_names, ElementsAre("n2"));
  EXPECT_EQ(s->Bind(BindFor("p1", "n1")).error, "");
  EXPECT_EQ(pauses, 1);  // p2 did not pause
  EXPECT_THAT(second.error, HasSubstr("locked by default/holder"));
  EXPECT_THAT(second.error, ::testing::Not(HasSubstr("waiting")));
  // With the waiter gone, the next bind waits again.
  ASSERT_THAT(*s->Filter(Args("p2", {"n2"})).node_names, ElementsAre("n2"));
  EXPECT_THAT(s->Bind(BindFor("p2", "n2")).error, HasSubstr("gave up after waiting 28s"));
  EXPECT_GT(pauses, 1);
}

TEST_F(SchedulerTest, BindOfADeletedPodFails) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  const BindArgs args = BindFor("p1", "n1");
  env_.Delete("pods", "default", "p1");
  BindOutcome outcome;
  BindResult b = s.Bind(args, &outcome);
  EXPECT_THAT(b.error, HasSubstr("not found"));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_EQ(Lock("n1"), "<none>");
  EXPECT_EQ(outcome.code, BindCode::kPodNotFound);
}

TEST_F(SchedulerTest, BindOfADeletedPodStillInTheCacheReleasesTheLock) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler* s = nullptr;
  kube::Pod cached;
  s = &Make([&](std::string_view, std::string_view name) -> std::optional<kube::Pod> {
    if (name == "p1") {
      return cached;
    }
    return std::nullopt;
  });
  ASSERT_THAT(*s->Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  cached = Pod("p1");  // annotated: the cache is current...
  const BindArgs args = BindFor("p1", "n1");
  env_.Delete("pods", "default", "p1");  // ...until the pod goes
  BindOutcome outcome;
  BindResult b = s->Bind(args, &outcome);
  EXPECT_NE(b.error, "");
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_EQ(Lock("n1"), "<none>");
  EXPECT_EQ(outcome.code, BindCode::kBindingRejected);
}

TEST_F(SchedulerTest, AFailedBindingReleasesLockAndReservationAndLeavesNoBindPhase) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  env_.faults()->Inject("POST", std::string(kPodPath) + "p1/binding", 500, "InternalError");
  BindOutcome outcome;
  BindResult b = s.Bind(BindFor("p1", "n1"), &outcome);
  EXPECT_THAT(b.error, HasSubstr("500"));
  ExpectNothingHeld("p1", "n1");
  const kube::Pod pod = Pod("p1");
  EXPECT_EQ(pod.node_name, "");
  // HAMi would have patched bind-phase=allocating before the binding and left it there.
  EXPECT_FALSE(pod.meta.annotations.Contains(device::kBindPhaseAnnotation));
  EXPECT_FALSE(pod.meta.annotations.Contains(device::kBindTimeAnnotation));
  EXPECT_EQ(outcome.code, BindCode::kBindingRejected);
}

TEST_F(SchedulerTest, BindToANodeOtherThanTheFilteredOneFails) {
  AddNode("n1", {{"GPU-a"}});
  AddNode("n2", {{"GPU-b"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  BindResult b = s.Bind(BindFor("p1", "n2"));
  EXPECT_THAT(b.error, HasSubstr("filtered to node n1, not n2"));
  ExpectNothingHeld("p1", "n2");
  EXPECT_EQ(Lock("n1"), "<none>");
}

TEST_F(SchedulerTest, BindAfterTheReservationExpiredRereservesWhenStillFree) {
  AddNode("n1", {{"GPU-a", 1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  clock_.Advance(absl::Minutes(6));
  ASSERT_EQ(s.ExpireReservations(clock_.Now()).size(), 1u);
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  std::vector<ledger::Reservation> res = ledger_.Reservations();
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].expires_at, clock_.Now() + absl::Minutes(5));
}

TEST_F(SchedulerTest, BindAfterTheReservationExpiredFailsWhenTheDevicesWereTaken) {
  AddNode("n1", {{"GPU-a", 1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  env_.CreatePod("p2", Limits(8000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  clock_.Advance(absl::Minutes(6));
  s.ExpireReservations(clock_.Now());
  ASSERT_THAT(*s.Filter(Args("p2", {"n1"})).node_names, ElementsAre("n1"));
  BindResult b = s.Bind(BindFor("p1", "n1"));
  EXPECT_THAT(b.error, HasSubstr("no longer free"));
  EXPECT_EQ(Lock("n1"), "<none>");
  // p2's reservation is untouched; p1 holds nothing.
  std::vector<ledger::Reservation> res = ledger_.Reservations();
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].name, "p2");
}

TEST_F(SchedulerTest, ABoundPodKeepsItsReservationPastTheTtlUntilObservedBound) {
  // Finding 2 of docs/simulate.md: the reservation expiring between the binding POST and the
  // informer observing the pod bound freed a running pod's share for the next filter.
  AddNode("n1", {{"GPU-a", 1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  env_.CreatePod("p2", Limits(8000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  clock_.Advance(absl::Minutes(6));  // past the bind's fresh TTL, not yet observed
  EXPECT_THAT(s.ExpireReservations(clock_.Now()), IsEmpty());
  ASSERT_EQ(ledger_.Reservations().size(), 1u);
  FilterResult r = s.Filter(Args("p2", {"n1"}));
  EXPECT_THAT(*r.node_names, IsEmpty()) << "p2 placed on p1's share";
  // The informer observes p1 bound: the record holds, the reservation ends, and expiry
  // forgets the bind.
  absl::StatusOr<ledger::PodAllocation> bound = accounting::ProjectPod(*vendor_, Pod("p1"));
  ASSERT_TRUE(bound.ok());
  ASSERT_EQ(bound->bound_node, "n1");
  ASSERT_TRUE(ledger_.Apply(*bound).ok());
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  EXPECT_THAT(s.ExpireReservations(clock_.Now()), IsEmpty());
  EXPECT_THAT(*s.Filter(Args("p2", {"n1"})).node_names, IsEmpty());
}

TEST_F(SchedulerTest, ABoundPodNeverObservedIsKeptOnlyForBoundHold) {
  options_.bound_hold = absl::Minutes(10);
  AddNode("n1", {{"GPU-a", 1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  clock_.Advance(absl::Minutes(9));
  EXPECT_THAT(s.ExpireReservations(clock_.Now()), IsEmpty());
  clock_.Advance(absl::Minutes(1));
  EXPECT_EQ(s.ExpireReservations(clock_.Now()).size(), 1u);
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
}

TEST_F(SchedulerTest, AFailedBindAfterExpiryIsNotKept) {
  AddNode("n1", {{"GPU-a", 1, 8000}});
  env_.CreatePod("p1", Limits(8000));
  SetLock("n1", "2026-01-01T00:00:00Z,default,other");
  env_.CreatePod("other", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  EXPECT_THAT(s.Bind(BindFor("p1", "n1")).error, HasSubstr("is locked by"));
  EXPECT_THAT(ledger_.Reservations(), IsEmpty());
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  clock_.Advance(absl::Minutes(6));
  EXPECT_EQ(s.ExpireReservations(clock_.Now()).size(), 1u);
}

TEST_F(SchedulerTest, ReleaseAbsentEndsOnlyReservationsOlderThanTheListOfAbsentPods) {
  // Finding 1 of docs/simulate.md: a pod filtered, bound and deleted while the watch was down
  // leaves no tombstone; the relist's LIST must end its reservation.
  AddNode("n1", {{"GPU-a", 4, 8000}});
  for (const char* name : {"gone", "present", "young"}) {
    env_.CreatePod(name, Limits(1000));
  }
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("gone", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_EQ(s.Bind(BindFor("gone", "n1")).error, "");
  ASSERT_THAT(*s.Filter(Args("present", {"n1"})).node_names, ElementsAre("n1"));
  clock_.Advance(absl::Seconds(1));
  const absl::Time list_started = clock_.Now();
  clock_.Advance(absl::Seconds(1));
  ASSERT_THAT(*s.Filter(Args("young", {"n1"})).node_names, ElementsAre("n1"));
  const std::string present_uid = Pod("present").meta.uid;
  std::vector<ledger::Reservation> released =
      s.ReleaseAbsent(list_started, [&](std::string_view uid) { return uid == present_uid; });
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].name, "gone");
  std::vector<std::string> left;
  for (const ledger::Reservation& r : ledger_.Reservations()) {
    left.push_back(r.name);
  }
  EXPECT_THAT(left, UnorderedElementsAre("present", "young"));
}

TEST_F(SchedulerTest, ConcurrentBindsToOneNodeAreSerialisedByTheLock) {
  // HAMi's invariant: one pod per node between bind and the device plugin's Allocate.
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  env_.CreatePod("p2", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  ASSERT_THAT(*s.Filter(Args("p2", {"n1"})).node_names, ElementsAre("n1"));
  const std::vector<BindArgs> binds = {BindFor("p1", "n1"), BindFor("p2", "n1")};
  std::vector<BindResult> results(2);
  std::barrier sync(2);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      sync.arrive_and_wait();
      results[i] = s.Bind(binds[i]);
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  const size_t winner = results[0].error.empty() ? 0 : 1;
  const size_t loser = 1 - winner;
  ASSERT_EQ(results[winner].error, "");
  EXPECT_THAT(results[loser].error, HasSubstr("is locked by"));
  const std::string win = binds[winner].pod_name;
  const std::string lose = binds[loser].pod_name;
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default," + win);
  EXPECT_EQ(Pod(win).node_name, "n1");
  EXPECT_EQ(Pod(lose).node_name, "");
  std::vector<ledger::Reservation> res = ledger_.Reservations();
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].name, win);
}

// Issue #21: /bind bound any pod to any node (a default-scheduler pod in kube-system asking for
// no GPU went to a node that does not exist). Each of these is refused with no API write.
TEST_F(SchedulerTest, BindRefusesPodsAndNodesThatAreNotOurs) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("plain", R"({"cpu":"1"})");
  env_.CreatePod("other", Limits(1000), "{}", "default-scheduler");
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  env_.faults()->Clear();
  struct Case {
    BindArgs args;
    std::string error;
    BindCode code;
  };
  const Case cases[] = {
      {BindFor("plain", "n1"), "pod default/plain asks for no device this scheduler manages",
       BindCode::kNotOurs},
      {BindFor("other", "n1"),
       R"(pod default/other names scheduler "default-scheduler", not "hami-scheduler")",
       BindCode::kNotOurs},
      {BindFor("p1", "ghost"), "node ghost is not registered", BindCode::kNodeUnregistered},
      {BindArgs{"", "default", "u", "n1"}, "not valid Kubernetes names", BindCode::kError},
      {BindArgs{"p1", "default", "u", ""}, "not valid Kubernetes names", BindCode::kError},
  };
  int not_ours = 0;
  for (const Case& c : cases) {
    BindOutcome outcome;
    BindResult b = s.Bind(c.args, &outcome);
    EXPECT_THAT(b.error, HasSubstr(c.error)) << c.args.pod_name << "@" << c.args.node;
    EXPECT_EQ(outcome.code, c.code) << c.args.pod_name << "@" << c.args.node;
    EXPECT_EQ(outcome.lock, std::nullopt) << "no lock step for a refusal";
    not_ours += outcome.code == BindCode::kNotOurs ? 1 : 0;
  }
  for (const kube::Request& r : env_.faults()->requests()) {
    if (r.path == "/api/v1/namespaces/default/events") {
      continue;  // BindingFailed
    }
    EXPECT_EQ(r.method, "GET") << r.method << " " << r.path;
    EXPECT_NE(r.path, "/api/v1/namespaces/default/pods") << "an empty name became a LIST";
  }
  EXPECT_EQ(Pod("plain").node_name, "");
  EXPECT_EQ(Pod("other").node_name, "");
  EXPECT_EQ(Pod("p1").node_name, "");
  EXPECT_EQ(Lock("n1"), "<none>");
  ASSERT_EQ(ledger_.Reservations().size(), 1u);  // p1's filter decision is untouched
  EXPECT_EQ(not_ours, 2);
  // The real bind of p1 still goes through.
  EXPECT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
}

// With no scheduler name (HAMi's webhook then leaves spec.schedulerName alone) any scheduler's
// pod that this extender filtered is bound.
TEST_F(SchedulerTest, WithoutASchedulerNameAnySchedulersPodIsBound) {
  options_.scheduler_name = "";
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000), "{}", "default-scheduler");
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  EXPECT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  EXPECT_EQ(Pod("p1").node_name, "n1");
}

TEST_F(SchedulerTest, LockConflictDuringBindIsRetried) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  env_.faults()->Inject("PATCH", "/api/v1/nodes/n1", 409, "Conflict");
  BindOutcome outcome;
  EXPECT_EQ(s.Bind(BindFor("p1", "n1"), &outcome).error, "");
  EXPECT_EQ(Lock("n1"), "2026-01-01T00:00:00Z,default,p1");
  EXPECT_EQ(outcome.lock_conflicts, 1);
}

TEST_F(SchedulerTest, EventFailuresNeverFailTheRequest) {
  AddNode("n1", {{"GPU-a"}});
  env_.CreatePod("p1", Limits(1000));
  Scheduler& s = Make();
  env_.faults()->Inject("POST", "/api/v1/namespaces/default/events", 500, "InternalError", 10);
  ASSERT_THAT(*s.Filter(Args("p1", {"n1"})).node_names, ElementsAre("n1"));
  EXPECT_EQ(s.Bind(BindFor("p1", "n1")).error, "");
  s.events().Flush();
  EXPECT_EQ(s.events().counts().failed, 2u);
  EXPECT_EQ(s.events().counts().sent, 0u);
}

}  // namespace
}  // namespace tessera::extender
