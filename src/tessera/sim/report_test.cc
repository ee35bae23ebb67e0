#include <string>
#include <vector>

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

// The pods refused while a fault's divergence was open, and how long after its repair each was
// bound (issue #35). The divergence of SeedBugRun: seen at 13 s, healed by 16 s (repair taken
// at 15 s, one sampling interval before the observation).
TEST(ReportTest, RepairWaitsCountThePodsRefusedWhileTheLedgerWasWrong) {
  const RunResult r = SeedBugRun("", "", false);
  const auto at = [](double s) { return kStart + absl::Seconds(s); };
  const absl::Time never = absl::InfiniteFuture();
  std::vector<PodTimes> pods = {
      {at(1), at(2), at(15.5)},         // refused before the fault, bound 0.5 s after the repair
      {at(12.5), at(12.6), at(18)},     // refused just before the divergence was seen
      {at(13.5), at(14), at(14.5)},     // bound while it still diverged
      {at(14), at(14.2), never},        // never bound
      {at(14), at(14.2), never, true},  // deleted while pending: not counted
      {at(1), never, at(1.5)},          // never refused
      {at(1), at(2), at(3)},            // bound before the divergence
      {at(20), at(21), at(30)},         // refused after the repair
  };
  const RepairWaits w = ComputeRepairWaits(r.divergences, {}, pods, absl::Seconds(1));
  EXPECT_EQ(w.refused_while_wrong, 4);
  EXPECT_EQ(w.bound_before_repair, 1);
  EXPECT_EQ(w.still_pending, 1);
  EXPECT_EQ(w.seconds, (std::vector<double>{0.5, 3.0}));

  // A transient difference counts as a divergence does.
  const RepairWaits t = ComputeRepairWaits({}, {{at(13), at(16)}}, pods, absl::Seconds(1));
  EXPECT_EQ(t.seconds, w.seconds);
  EXPECT_EQ(t.refused_while_wrong, w.refused_while_wrong);
  // A difference the oracle credits to the fault that begins after it (a pod in flight once the
  // ledger is repaired) does not move the repair.
  std::vector<Divergence> later = r.divergences;
  later.push_back(r.divergences[0]);
  later.back().start = at(15.5);
  later.back().end = at(20);
  const RepairWaits l = ComputeRepairWaits(later, {}, pods, absl::Seconds(1));
  EXPECT_EQ(l.seconds, w.seconds);
  EXPECT_EQ(l.bound_before_repair, w.bound_before_repair);
  // Two devices the fault broke, healed at 16 s and 18 s: the repair began at 15 s (the first
  // heal), and a pod bound at 17.5 s, while the second still diverged, waited 2.5 s for it.
  std::vector<Divergence> two = r.divergences;
  two.push_back(r.divergences[0]);
  two.back().start = at(13.5);
  two.back().end = at(18);
  std::vector<PodTimes> more = pods;
  more.push_back({at(1), at(2), at(17.5)});
  const RepairWaits b = ComputeRepairWaits(two, {}, more, absl::Seconds(1));
  EXPECT_EQ(b.seconds, (std::vector<double>{0.5, 2.5, 3.0}));
  // A divergence in flight is no fault's: nothing counts.
  std::vector<Divergence> in_flight = r.divergences;
  in_flight[0].cause = "in-flight";
  EXPECT_EQ(ComputeRepairWaits(in_flight, {}, pods, absl::Seconds(1)).refused_while_wrong, 0);
  // Never healed: every refused pod that was pending is still pending or bound before it.
  std::vector<Divergence> stale = r.divergences;
  stale[0].end = never;
  const RepairWaits s = ComputeRepairWaits(stale, {}, pods, absl::Seconds(1));
  EXPECT_EQ(s.refused_while_wrong, 5);
  EXPECT_EQ(s.still_pending, 1);
  EXPECT_EQ(s.bound_before_repair, 4);
  EXPECT_TRUE(s.seconds.empty());

  RunResult shown = r;
  shown.repair_waits = w;
  const std::string table = SummaryTable(shown);
  EXPECT_THAT(table, HasSubstr("  refused while wrong            4\n"));
  EXPECT_THAT(table,
              HasSubstr("    bound after the repair       2, median 1.8 s, max 3.0 s (at most)\n"));
  EXPECT_THAT(table, HasSubstr("    bound before it / pending    1 / 1\n"));
  const nlohmann::json j = nlohmann::json::parse(SummaryJson(shown));
  EXPECT_EQ(j["repair_waits"]["refused_while_wrong"], 4);
  EXPECT_EQ(j["repair_waits"]["bound_after_repair_s"], nlohmann::json::array({0.5, 3.0}));
  EXPECT_THAT(SummaryTable(r), Not(HasSubstr("refused while wrong")));
}

// A figure only one run shows (here the comparison's pods refused while the ledger was wrong)
// keeps the rows of both runs matched by name.
TEST(ReportTest, RowsOnlyOneRunHasKeepTheTableAligned) {
  const RunResult p = SeedBugRun("self-healing on", "--resync-period=15s", false);
  RunResult c = SeedBugRun("self-healing off", "--resync-period=0 --audit-period=0", true);
  c.repair_waits.refused_while_wrong = 3;
  c.repair_waits.still_pending = 3;
  const std::string table = SummaryTable(p, &c);
  const auto line = [&](std::string_view name) {
    const size_t at = table.find("\n  " + std::string(name));
    return at == std::string::npos ? "" : table.substr(at + 1, table.find('\n', at + 1) - at - 1);
  };
  EXPECT_THAT(line("refused while wrong"), ::testing::MatchesRegex(".*wrong +- +3"));
  EXPECT_THAT(line("  bound before it / pending"), ::testing::MatchesRegex(".* - +0 / 3"));
  EXPECT_THAT(line("outlived the window"),
              ::testing::MatchesRegex(".*0 \\(window 45.0 s\\) +2 \\(window 45.0 s\\)"));
  EXPECT_THAT(ReportHtml(p, &c),
              HasSubstr("<tr><th>refused while wrong</th><td>-</td><td>3</td></tr>"));
}

// Tessera's requeue writes, from its counter in the samples: the total and the fastest second.
TEST(ReportTest, RequeueWritesComeFromTheSampledCounter) {
  RunResult r = SeedBugRun("", "", false);
  r.samples = {{absl::Seconds(1)}, {absl::Seconds(2)}, {absl::Seconds(3)}, {absl::Seconds(5)}};
  r.samples[1].requeued = 0;
  r.samples[2].requeued = 40;
  r.samples[3].requeued = 100;  // 60 in 2 s: 30/s
  const RequeueWrites w = ComputeRequeueWrites(r.samples);
  EXPECT_EQ(w.total, 100);
  EXPECT_DOUBLE_EQ(w.peak_per_second, 40);
  EXPECT_THAT(SummaryTable(r), HasSubstr("  requeue writes (Tessera)       100, at most 40/s\n"));
  EXPECT_EQ(nlohmann::json::parse(SummaryJson(r))["requeue_writes"]["total"], 100);
  EXPECT_THAT(SummaryTable(SeedBugRun("", "", false)), Not(HasSubstr("requeue writes")));
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
