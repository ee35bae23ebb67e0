// File: tessera/extender/scheduler_test_fixture.h
//
// Test-only: SchedulerTest, the fixture of the Scheduler's filter and bind tests
// (scheduler_filter_test.cc, scheduler_bind_test.cc, scheduler_write_behind_test.cc,
// scheduler_verdict_test.cc, one binary). Over SchedulerFixture (scheduler_testutil.h): GPU nodes
// registered with apisim and the ledger, the node lock read and set, filter and bind arguments,
// the pod's patches and the events, and a namespace quota on GPU memory. Errors are gtest
// failures. Not thread-safe beyond the Scheduler.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/accounting/quota_book.h"
#include "tessera/device/annotations.h"
#include "tessera/extender/scheduler.h"
#include "tessera/extender/scheduler_testutil.h"
#include "tessera/kube/objects.h"
#include "tessera/ledger/ledger.h"

namespace tessera::extender {

inline const absl::Time kNow = kFixtureNow;
inline constexpr const char* kPodPath = kFixturePodPath;

struct Gpu {
  std::string uuid;
  int count = 10;
  int mem = 8000;
  int cores = 100;
};

inline std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
    }
    out += c;
  }
  return out;
}

inline std::string Register(const std::vector<Gpu>& gpus) {
  std::string out = "[";
  for (size_t i = 0; i < gpus.size(); ++i) {
    out += fmt::format(
        R"({}{{"id":"{}","index":{},"count":{},"devmem":{},"devcore":{},"type":"NVIDIA-T4",)"
        R"("health":true}})",
        i == 0 ? "" : ",", gpus[i].uuid, i, gpus[i].count, gpus[i].mem, gpus[i].cores);
  }
  return out + "]";
}

inline std::string Limits(int mem, int cores = 0, int count = 1) {
  return fmt::format(
      R"({{"nvidia.com/gpu":"{}","nvidia.com/gpumem":"{}","nvidia.com/gpucores":"{}"}})", count,
      mem, cores);
}

class SchedulerTest : public SchedulerFixture {
 protected:
  void SetUp() override {
    SchedulerFixture::SetUp();
    options_.lock.sleep = [](absl::Duration) {};
  }

  // A node registered with the API server and in the ledger.
  void AddNode(const std::string& name, const std::vector<Gpu>& gpus) {
    env_.CreateNode(
        name, fmt::format(R"({{"hami.io/node-nvidia-register":"{}"}})", Escape(Register(gpus))));
    FillLedger(ledger_, {name});
  }
  void ClearLock(const std::string& node) {
    kube::MetadataPatch patch;
    patch.annotations.emplace_back(std::string(device::kNodeLockAnnotation), std::nullopt);
    ASSERT_TRUE(env_.client()->PatchNodeMetadata(node, patch).ok());
  }
  void SetLock(const std::string& node, const std::string& value) {
    kube::MetadataPatch patch;
    patch.annotations.emplace_back(std::string(device::kNodeLockAnnotation), value);
    ASSERT_TRUE(env_.client()->PatchNodeMetadata(node, patch).ok());
  }
  std::string Lock(const std::string& node) {
    return std::string(
        env_.client()->GetNode(node)->meta.annotations.Get(device::kNodeLockAnnotation, "<none>"));
  }
  // Node n1 (one 48000 MiB GPU) with 36000 MiB held by default/r1, pod p1 asking 8000 MiB, and
  // a scheduler whose quotas are `book`'s (the quota tests put 40000 MiB there).
  Scheduler& MakeWithQuotaOn36000MiBUsed(const accounting::QuotaBook* book) {
    AddNode("n1", {{"GPU-a", 10, 48000}});
    ledger::PodAllocation running{
        "r1", "default", "r1", "n1", "n1", false, false, false, {{{"GPU-a", "NVIDIA", 36000, 0}}},
        0};
    EXPECT_TRUE(ledger_.Apply(running).ok());
    env_.CreatePod("p1", Limits(8000));
    scheduler_ = std::make_unique<Scheduler>(
        options_, Scheduler::Deps{&ledger_, env_.client(), &clock_, nullptr, book});
    return *scheduler_;
  }
  FilterArgs Args(const std::string& pod, std::vector<std::string> nodes) {
    FilterArgs args;
    args.pod = Pod(pod);
    args.node_names = std::move(nodes);
    return args;
  }
  BindArgs BindFor(const std::string& pod, const std::string& node) {
    return BindArgs{pod, "default", Pod(pod).meta.uid, node};
  }
  std::vector<kube::Request> PodPatches(const std::string& pod) {
    return env_.faults()->Matching("PATCH", kPodPath + pod);
  }
  std::vector<std::string> EventReasons() {
    std::vector<std::string> out;
    for (const SeenEvent& e : Events()) {
      out.push_back(e.reason);
    }
    return out;
  }
  // The state a failed bind must leave: no reservation, no lock, pod not bound or marked.
  void ExpectNothingHeld(const std::string& pod, const std::string& node) {
    EXPECT_THAT(ledger_.Reservations(), ::testing::IsEmpty());
    EXPECT_EQ(Lock(node), "<none>");
    kube::Pod p = Pod(pod);
    EXPECT_EQ(p.node_name, "");
    EXPECT_FALSE(p.meta.annotations.Contains(device::kBindPhaseAnnotation));
  }
};

using ::tessera::testing::GpuMemQuota;

}  // namespace tessera::extender
