#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/sim/simulation.h"

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kStart = absl::FromUnixSeconds(1000);

// A seed-bug-like run: one 3 s divergence (healed), or with `stale` one that never healed.
RunResult SeedBugRun(const std::string& label, const std::string& args, bool stale) {
  RunResult r;
  r.scenario = "seed-bug";
  r.label = label;
  r.scheduler_args = args;
  r.seed = 7;
  r.nodes = 10;
  r.gpus = 80;
  r.duration = absl::Seconds(20);
  r.window = absl::Seconds(45);
  r.elapsed = absl::Seconds(70);
  r.start = kStart;
  r.created = 300;
  r.scheduled = 300;
  r.faults.push_back({absl::Seconds(12), "drop_events", "DELETED pod events dropped"});
  Divergence d{"GPU-a",
               "",
               "node-1",
               kStart + absl::Seconds(13),
               kStart + absl::Seconds(16),
               "drop_events",
               "truth 0 MiB / 0 slots / 0% cores, exported 4000 MiB / 1 slots / 0% "
               "cores",
               4,
               false};
  if (stale) {
    d.end = absl::InfiniteFuture();
    d.violation = true;
    r.violations.push_back(
        {kStart + absl::Seconds(70), "divergence on GPU-a (node-1) never healed"});
    Divergence share = d;
    share.pod = "default/sim-000042";
    share.detail = "pod share: truth 0 MiB / 0% cores, exported 4000 MiB / 0% cores";
    r.divergences.push_back(share);
    r.violations.push_back({kStart + absl::Seconds(70),
                            "divergence on pod default/sim-000042 on GPU-a (node-1) never healed"});
  }
  r.divergences.push_back(d);
  r.samples.push_back({absl::Seconds(1), 1000, 1000, 0, 300, 0});
  r.samples.push_back({absl::Seconds(20), 1000, 5000, 1, 240, stale ? 1 : 0});
  return r;
}

TEST(ReportTest, OneRunKeepsItsFormat) {
  const RunResult r = SeedBugRun("", "--resync-period=15s", false);
  EXPECT_TRUE(Succeeded(r, nullptr));
  const std::string table = SummaryTable(r);
  EXPECT_THAT(table, HasSubstr("scenario seed-bug (seed 7), 10 nodes, 80 GPUs, 20.0 s + drain\n"));
  EXPECT_THAT(table, HasSubstr("  pods created                   300\n"));
  EXPECT_THAT(table, HasSubstr("longest divergence             3.0 s on GPU-a (node-1)"));
  EXPECT_THAT(table, Not(HasSubstr("comparison")));
  EXPECT_THAT(table, HasSubstr("verdict: PASS\n"));

  const nlohmann::json j = nlohmann::json::parse(SummaryJson(r));
  EXPECT_EQ(j["scenario"], "seed-bug");
  EXPECT_EQ(j["pods"]["created"], 300);
  EXPECT_EQ(j["passed"], true);
  EXPECT_EQ(j["succeeded"], true);
  EXPECT_FALSE(j.contains("comparison"));
  EXPECT_TRUE(j["divergences"][0]["pod"].is_null());

  const std::string html = ReportHtml(r);
  EXPECT_THAT(html, HasSubstr("<span class='pass'>PASS</span>"));
  EXPECT_THAT(html, Not(HasSubstr("comparison")));
}

TEST(ReportTest, AComparisonIsReportedBesideThePrimaryRun) {
  const RunResult p = SeedBugRun("self-healing on", "--resync-period=15s", false);
  const RunResult c = SeedBugRun("self-healing off", "--resync-period=0 --audit-period=0", true);
  // The comparison's divergences are what it is run to show: the verdict is the primary's.
  EXPECT_EQ(OutlivedWindow(c), 2);
  EXPECT_EQ(OverCommits(c), 0);
  EXPECT_TRUE(Succeeded(p, &c));

  const std::string table = SummaryTable(p, &c);
  EXPECT_THAT(table, HasSubstr("run twice"));
  EXPECT_THAT(table, HasSubstr("self-healing on"));
  EXPECT_THAT(table, HasSubstr("comparison: self-healing off"));
  EXPECT_THAT(table, HasSubstr("--resync-period=0 --audit-period=0"));
  EXPECT_THAT(table, HasSubstr("FAIL, as expected: the divergence outlived the window"));
  EXPECT_THAT(table, HasSubstr("on pod default/sim-000042 on GPU-a (node-1)"));
  EXPECT_THAT(table, HasSubstr("comparison: self-healing off kept 2 divergences (1 devices, 1 pod "
                               "shares) past the 45.0 s window (the longest 57.0 s); self-healing "
                               "on healed every divergence within the window"));
  EXPECT_THAT(table, HasSubstr("verdict: PASS (self-healing on's; the comparison's divergences are "
                               "expected)"));

  // summary.json: the primary's keys where they were, the comparison's in the same shape.
  const nlohmann::json j = nlohmann::json::parse(SummaryJson(p, &c));
  EXPECT_EQ(j["label"], "self-healing on");
  EXPECT_EQ(j["scheduler_args"], "--resync-period=15s");
  EXPECT_EQ(j["passed"], true);
  EXPECT_EQ(j["succeeded"], true);
  ASSERT_TRUE(j.contains("comparison"));
  const nlohmann::json& cj = j["comparison"];
  EXPECT_EQ(cj["label"], "self-healing off");
  EXPECT_EQ(cj["passed"], false);
  EXPECT_EQ(cj["showed_divergence"], true);
  EXPECT_EQ(cj["outlived_window"], 2);
  EXPECT_EQ(cj["divergences"][0]["pod"], "default/sim-000042");
  for (const auto& [key, value] : j.items()) {
    if (key == "comparison" || key == "succeeded") continue;
    EXPECT_TRUE(cj.contains(key)) << key;
  }

  const std::string html = ReportHtml(p, &c);
  EXPECT_THAT(html, HasSubstr("<th>self-healing on</th><th>comparison: self-healing off</th>"));
  EXPECT_THAT(html, HasSubstr("<tr><th>scheduler args</th><td><code>--resync-period=15s</code></td>"
                              "<td><code>--resync-period=0 --audit-period=0</code></td></tr>"));
  EXPECT_THAT(html, HasSubstr("<h2>comparison: self-healing off: allocated GPU memory <span "
                              "class='expected'>FAIL, as expected"));
  size_t charts = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    ++charts;
  }
  EXPECT_EQ(charts, 2u);
}

TEST(ReportTest, AnOverCommitInTheComparisonFailsTheRun) {
  const RunResult p = SeedBugRun("self-healing on", "--resync-period=15s", false);
  RunResult c = SeedBugRun("self-healing off", "--resync-period=0", false);
  c.violations.push_back({kStart + absl::Seconds(30), "over-commit on GPU-a", true});
  EXPECT_FALSE(Succeeded(p, &c));
  EXPECT_THAT(SummaryTable(p, &c), HasSubstr("verdict: FAIL"));
  EXPECT_THAT(SummaryTable(p, &c), HasSubstr("over-committed a device"));
  EXPECT_EQ(nlohmann::json::parse(SummaryJson(p, &c))["succeeded"], false);
  // And a primary run that fails fails whatever the comparison shows.
  RunResult bad = SeedBugRun("self-healing on", "--resync-period=15s", true);
  EXPECT_FALSE(Succeeded(bad, &c));
  EXPECT_FALSE(Succeeded(bad, nullptr));
}

TEST(ReportTest, SaysWhichControlPlaneRanAndWhichFaultsItSkipped) {
  RunResult apisim = SeedBugRun("", "", false);
  EXPECT_THAT(SummaryTable(apisim),
              HasSubstr("  control plane                  apisim (kube-scheduler emulated)\n"));
  EXPECT_THAT(SummaryTable(apisim), Not(HasSubstr("faults skipped")));
  EXPECT_EQ(nlohmann::json::parse(SummaryJson(apisim))["control_plane"], "apisim");

  RunResult real = SeedBugRun("", "", false);
  real.control_plane = "real";
  real.skipped_faults.push_back({absl::Seconds(8), "error_storm", "apisim only"});
  const std::string table = SummaryTable(real);
  EXPECT_THAT(table, HasSubstr("  control plane                  real (etcd, kube-apiserver, "
                               "kube-scheduler)\n"));
  EXPECT_THAT(table,
              HasSubstr("  faults skipped                 1 (1 error_storm: apisim only)\n"));
  EXPECT_THAT(table, HasSubstr("filter latency p50 / p99       n/a"));
  nlohmann::json j = nlohmann::json::parse(SummaryJson(real));
  EXPECT_EQ(j["control_plane"], "real");
  ASSERT_EQ(j["skipped_faults"].size(), 1u);
  EXPECT_EQ(j["skipped_faults"][0]["kind"], "error_storm");
  EXPECT_THAT(ReportHtml(real), HasSubstr("control plane <b>real (etcd, kube-apiserver, "
                                          "kube-scheduler)</b>"));
}

TEST(ReportTest, NamesTheSchedulerUnderTest) {
  RunResult tessera = SeedBugRun("", "", false);
  EXPECT_THAT(SummaryTable(tessera), HasSubstr("  scheduler under test           tessera serve\n"));
  RunResult hami = SeedBugRun("", "", false);
  hami.scheduler = "HAMi (/cache/v2.5.2/hami-scheduler)";
  EXPECT_THAT(SummaryTable(hami), HasSubstr("HAMi (/cache/v2.5.2/hami-scheduler)"));
  EXPECT_EQ(nlohmann::json::parse(SummaryJson(hami))["scheduler"],
            "HAMi (/cache/v2.5.2/hami-scheduler)");
  EXPECT_THAT(ReportHtml(hami),
              HasSubstr("scheduler under test <b>HAMi (/cache/v2.5.2/hami-scheduler)</b>"));
}

}  // namespace
}  // namespace tessera::sim
