// File: tessera/extender/scheduler_testutil.h
//
// Test-only: the fixture the Scheduler's tests share (scheduler_test, refit_scheduler_test). An
// in-process apisim reached over the real HTTP client, a ledger filled directly (the informers
// are not part of the extender library), a FakeClock at kFixtureNow, the NVIDIA vendor, and
// helpers that read a pod and the events the scheduler recorded. SetUp starts apisim; a test's
// own SetUp calls it first. Errors are gtest failures. Not thread-safe beyond the Scheduler.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/accounting/projection.h"
#include "tessera/base/clock.h"
#include "tessera/extender/scheduler.h"
#include "tessera/testing/apisim_env.h"
#include "tessera/testing/objects.h"

namespace tessera::extender {

inline const absl::Time kFixtureNow = absl::FromUnixSeconds(1767225600);  // 2026-01-01T00:00:00Z
inline constexpr char kFixturePodPath[] = "/api/v1/namespaces/default/pods/";

// An event in the default namespace, as the API server holds it.
struct SeenEvent {
  std::string reason, message, type, component, pod, uid;
};

class SchedulerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.Start();
    options_.vendor = vendor_.get();
    // Most tests check what the patch did when a call returns; write-behind tests turn it on.
    options_.write_behind = false;
  }

  // The registered `nodes` as `ledger` would have observed them (projected from the API server).
  void FillLedger(ledger::Ledger& ledger, const std::vector<std::string>& nodes) {
    for (const std::string& n : nodes) {
      absl::StatusOr<kube::Node> node = env_.client()->GetNode(n);
      ASSERT_TRUE(node.ok()) << node.status();
      auto devices = accounting::ProjectNode(*vendor_, *node);
      ASSERT_TRUE(devices.ok()) << devices.status();
      ASSERT_TRUE(ledger.SetNode(*devices).ok());
    }
  }
  kube::Pod Pod(const std::string& name) {
    absl::StatusOr<kube::Pod> pod = env_.client()->GetPod("default", name);
    EXPECT_TRUE(pod.ok()) << pod.status();
    return pod.ok() ? *pod : kube::Pod();
  }
  std::string Annotation(const std::string& pod, std::string_view key) {
    return std::string(Pod(pod).meta.annotations.Get(key, "<none>"));
  }
  Scheduler& Make(PodLookup lookup = nullptr) {
    scheduler_ = std::make_unique<Scheduler>(
        options_, Scheduler::Deps{&ledger_, env_.client(), &clock_, std::move(lookup)});
    return *scheduler_;
  }
  // The events of the default namespace, after the scheduler's recorder flushed.
  std::vector<SeenEvent> Events() {
    scheduler_->events().Flush();
    absl::StatusOr<std::string> list =
        env_.store().List(*apisim::FindResource("", "v1", "events"), "default", {});
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<SeenEvent> out;
    if (!list.ok()) {
      return out;
    }
    const nlohmann::json doc = nlohmann::json::parse(*list);
    for (const auto& item : doc["items"]) {
      out.push_back({item.value("reason", ""), item.value("message", ""), item.value("type", ""),
                     item["source"].value("component", ""),
                     item["involvedObject"].value("name", ""),
                     item["involvedObject"].value("uid", "")});
    }
    return out;
  }

  testing::ApisimEnv env_;
  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger_;
  FakeClock clock_{kFixtureNow};
  Scheduler::Options options_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace tessera::extender
