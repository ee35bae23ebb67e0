// Registry under concurrent use: recorders on several threads while another renders. Every
// increment must be counted once (prometheus-cpp's metrics are atomic; the informer clock map is
// mutex-guarded), and TSan (this test's label runs it there) must see no race.
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/base/clock.h"
#include "tessera/ledger/ledger.h"
#include "tessera/metrics/registry.h"

namespace tessera::metrics {
namespace {

using ::testing::HasSubstr;

TEST(RegistryConcurrency, RecordersAndRenderersRace) {
  FakeClock clock;
  Registry registry({"v", "r", "c"}, &clock);
  ledger::Ledger ledger;
  auto node = std::make_shared<device::NodeDevices>();
  node->node = "n";
  node->devices.push_back(device::DeviceInfo{"GPU-0", 0, 10, 1024, 100, "T"});
  ASSERT_TRUE(ledger.SetNode(node).ok());

  constexpr int kThreads = 4;
  constexpr int kIterations = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, &clock, t] {
      const std::string resource = t % 2 == 0 ? "pods" : "nodes";
      for (int i = 0; i < kIterations; ++i) {
        registry.RecordFilter(FilterOutcome::kScheduled, "", absl::Microseconds(i));
        registry.RecordBind(BindOutcome::kBound, absl::Microseconds(i));
        registry.RecordInformerEvents(resource, 1);
        registry.SetInformerSynced(resource, true);
        registry.RecordAuditCorrections("stale", 1);
        clock.Advance(absl::Microseconds(1));
      }
    });
  }
  std::thread renderer([&] {
    for (int i = 0; i < 50; ++i) {
      const std::string text = registry.Render(ledger.Full(), i % 2 == 0);
      EXPECT_THAT(text, HasSubstr("# TYPE tessera_filter_duration_seconds histogram\n"));
    }
  });
  for (auto& t : threads) {
    t.join();
  }
  renderer.join();

  const std::string text = registry.Render(ledger.Full(), false);
  const std::string total = std::to_string(kThreads * kIterations);
  EXPECT_THAT(text, HasSubstr("tessera_filter_duration_seconds_count " + total + "\n"));
  EXPECT_THAT(text, HasSubstr("tessera_filter_decisions_total{outcome=\"scheduled\",reason=\"\"} " +
                              total + "\n"));
  EXPECT_THAT(text, HasSubstr("tessera_bind_total{outcome=\"bound\"} " + total + "\n"));
  EXPECT_THAT(text,
              HasSubstr("tessera_ledger_audit_corrections_total{cause=\"stale\"} " + total + "\n"));
  const std::string half = std::to_string(kThreads / 2 * kIterations);
  EXPECT_THAT(text, HasSubstr("tessera_informer_events_total{resource=\"pods\"} " + half + "\n"));
  EXPECT_THAT(text, HasSubstr("tessera_informer_events_total{resource=\"nodes\"} " + half + "\n"));
}

}  // namespace
}  // namespace tessera::metrics
