#include "tessera/sim/scenario.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;

TEST(ScenarioTest, EveryEmbeddedScenarioParses) {
  for (const char* name : {"quick", "seed-bug", "chaos", "scale", "quota", "mig", "preemption"}) {
    absl::StatusOr<Scenario> s = LoadScenario(name);
    ASSERT_TRUE(s.ok()) << name << ": " << s.status();
    EXPECT_EQ(s->name, name);
    EXPECT_GT(s->nodes, 0);
    EXPECT_GE(s->drain, s->window) << name << ": the drain must let the oracle judge healing";
  }
  absl::StatusOr<Scenario> quick = LoadScenario("quick");
  EXPECT_EQ(quick->nodes, 20);
  EXPECT_EQ(quick->gpus_per_node, 8);
  EXPECT_EQ(quick->max_pods, 1000);
  // preemption: two priorities, and serve preempting by itself.
  absl::StatusOr<Scenario> preemption = LoadScenario("preemption");
  EXPECT_EQ(preemption->priorities.size(), 2u);
  EXPECT_THAT(preemption->scheduler_args, HasSubstr("--preemption=self"));
  absl::StatusOr<Scenario> scale = LoadScenario("scale");
  EXPECT_EQ(scale->nodes, 1000);
  EXPECT_EQ(scale->max_pods, 20000);
  // chaos injects every kind of fault.
  absl::StatusOr<Scenario> chaos = LoadScenario("chaos");
  std::set<FaultKind> kinds;
  for (const FaultSpec& f : chaos->faults) kinds.insert(f.kind);
  EXPECT_EQ(kinds.size(), 9u);
}

TEST(ScenarioTest, ParsesEveryField) {
  absl::StatusOr<Scenario> s = ParseScenario(R"(
name: t
seed: 9
duration: 12s
drain: 3s
convergence_window: 2s
scheduler_args: --audit-period=0
cluster: {nodes: 3, gpus_per_node: 2, slots: 4, delimited_share: 1, gpu_types: [A], devmem_mib: [1000]}
workload:
  create_rate: 5
  pods: 7
  delete_rate: 1
  lifetime: [1s, 2s]
  full_nodes_share: 0.5
  shapes: {numa: 2, typed: 1}
faults:
  - {kind: error_storm, at: 1s, every: 4s, duration: 1s, code: 429, probability: 0.2}
  - {kind: drop_events, at: 2s, type: MODIFIED, delete_burst: 3}
)");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->seed, 9u);
  EXPECT_EQ(s->duration, absl::Seconds(12));
  EXPECT_EQ(s->window, absl::Seconds(2));
  EXPECT_EQ(s->scheduler_args, "--audit-period=0");
  EXPECT_EQ(s->slots, 4);
  EXPECT_EQ(s->lifetime_max, absl::Seconds(2));
  EXPECT_EQ(s->shapes.size(), 2u);
  EXPECT_EQ(s->shapes.at(Shape::kNuma), 2);
  ASSERT_EQ(s->faults.size(), 2u);
  EXPECT_EQ(s->faults[0].kind, FaultKind::kErrorStorm);
  EXPECT_EQ(s->faults[0].every, absl::Seconds(4));
  EXPECT_EQ(s->faults[0].code, 429);
  EXPECT_EQ(s->faults[1].event_type, "MODIFIED");
  EXPECT_EQ(s->faults[1].delete_burst, 3);
}

TEST(ScenarioTest, PrioritiesAreWeightedValues) {
  absl::StatusOr<Scenario> s = ParseScenario("workload: {priorities: {0: 3, 1000: 1}}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->priorities, (std::map<int32_t, double>{{0, 3}, {1000, 1}}));
  EXPECT_TRUE(ParseScenario("name: x\n")->priorities.empty());
  EXPECT_THAT(ParseScenario("workload: {priorities: {-1: 1}}\n").status().message(),
              HasSubstr("workload.priorities.-1: want a priority in [0, 1000000000]"));
  EXPECT_THAT(ParseScenario("workload: {priorities: {2000000000: 1}}\n").status().message(),
              HasSubstr("want a priority in [0, 1000000000]"));
  EXPECT_THAT(ParseScenario("workload: {priorities: {5: 0}}\n").status().message(),
              HasSubstr("workload.priorities.5: want a positive weight"));
  EXPECT_THAT(ParseScenario("workload: {priorities: [1, 2]}\n").status().message(),
              HasSubstr("workload.priorities: want a map of priority: weight"));
}

TEST(ScenarioTest, NamespacesWithQuotasTakeThePodsInTurn) {
  absl::StatusOr<Scenario> s = ParseScenario(R"(
namespaces:
  - {name: ml, gpumem: 40000, gpucores: 200}
  - {name: free}
)");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->namespaces.size(), 2u);
  EXPECT_EQ(s->namespaces[0].gpumem, 40000);
  EXPECT_EQ(s->namespaces[0].gpucores, 200);
  EXPECT_FALSE(s->namespaces[1].gpumem.has_value());
  EXPECT_EQ(s->NamespaceOf("sim-000004"), "ml");
  EXPECT_EQ(s->NamespaceOf("sim-000007"), "free");
  EXPECT_EQ(Scenario{}.NamespaceOf("sim-000007"), "default");
  for (const char* bad : {"namespaces: {ml: 1}", "namespaces: [{gpumem: 1}]",
                          "namespaces: [{name: ML}]", "namespaces: [{name: a, gpumem: -1}]",
                          "namespaces: [{name: a}, {name: a}]", "namespaces: [{name: a, x: 1}]"}) {
    absl::StatusOr<Scenario> r = ParseScenario(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("namespaces")) << bad;
  }
}

TEST(ScenarioTest, MigNodesAreASpreadShareWithKnownModels) {
  absl::StatusOr<Scenario> s = ParseScenario(R"(
cluster: {nodes: 10, delimited_share: 0.3, mig_share: 0.3, mig_models: [A100-40GB, H100-80GB]}
)");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->mig_models, (std::vector<std::string>{"A100-40GB", "H100-80GB"}));
  std::vector<int> mig, delimited;
  const std::vector<bool> is_mig = s->MigNodes();
  ASSERT_EQ(is_mig.size(), 10u);
  for (int i = 0; i < s->nodes; ++i) {
    if (is_mig[static_cast<size_t>(i)]) mig.push_back(i);
    if (s->IsDelimitedNode(i)) delimited.push_back(i);
  }
  // Three of ten, spread over the seven JSON nodes; none of them a delimited one.
  EXPECT_EQ(delimited, (std::vector<int>{3, 6, 9}));
  EXPECT_EQ(mig, (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(Scenario{}.MigNodes(), std::vector<bool>(20, false));  // mig_share 0: none
  for (const char* bad :
       {"cluster: {mig_share: 1.5}", "cluster: {mig_share: -0.1}", "cluster: {mig_models: []}",
        "cluster: {mig_models: [A100-41GB]}", "cluster: {mig_models: [H200, H200]}",
        "cluster: {mig_models: A100-40GB}", "cluster: {delimited_share: 2}",
        "cluster: {nodes: 10, delimited_share: 0.5, mig_share: 0.6}"}) {
    absl::StatusOr<Scenario> r = ParseScenario(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("cluster.")) << bad;
  }
  EXPECT_THAT(
      ParseScenario("cluster: {nodes: 10, delimited_share: 0.5, mig_share: 0.6}")
          .status()
          .message(),
      HasSubstr("6 of 10 nodes wanted in mig mode, but with delimited_share 0.5 only 5 run"));
  EXPECT_THAT(
      ParseScenario("cluster: {mig_models: [A100-41GB]}").status().message(),
      HasSubstr("unknown model \"A100-41GB\" (known: A100-40GB, A100-80GB, H100-80GB, H200)"));
}

TEST(ScenarioTest, ParsesAComparison) {
  absl::StatusOr<Scenario> s = ParseScenario(R"(
scheduler_args: --resync-period=15s
compare:
  scheduler_args: "  --resync-period=0   --audit-period=0 "
  label: self-healing off
  primary_label: self-healing on
)");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->compare.has_value());
  EXPECT_EQ(s->compare->scheduler_args, "--resync-period=0 --audit-period=0");
  EXPECT_EQ(s->compare->label, "self-healing off");
  EXPECT_EQ(s->compare->primary_label, "self-healing on");

  // Labels default; an empty argument list compares with serve's own defaults.
  s = ParseScenario("scheduler_args: --audit-period=0\ncompare: {scheduler_args: \"\"}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->compare->scheduler_args, "");
  EXPECT_EQ(s->compare->label, "comparison");
  EXPECT_EQ(s->compare->primary_label, "primary");

  EXPECT_FALSE(ParseScenario("name: x\n")->compare.has_value());

  // seed-bug runs itself with self-healing off as well.
  absl::StatusOr<Scenario> seed_bug = LoadScenario("seed-bug");
  ASSERT_TRUE(seed_bug->compare.has_value());
  EXPECT_EQ(seed_bug->compare->scheduler_args, "--resync-period=0 --audit-period=0");
  EXPECT_NE(seed_bug->scheduler_args, seed_bug->compare->scheduler_args);
}

TEST(ScenarioTest, RejectsABadComparison) {
  auto error = [](const std::string& yaml) {
    return std::string(ParseScenario(yaml).status().message());
  };
  EXPECT_THAT(error("compare: --resync-period=0\n"), HasSubstr("compare: want a map"));
  EXPECT_THAT(error("compare: {label: off}\n"), HasSubstr("compare.scheduler_args: missing"));
  EXPECT_THAT(error("compare: {scheduler_args: [--a, --b]}\n"),
              HasSubstr("compare.scheduler_args: want a string"));
  EXPECT_THAT(error("compare: {scheduler_args: resync=0}\n"),
              HasSubstr("want flags of tessera serve"));
  EXPECT_THAT(error("scheduler_args: --a=1  --b\ncompare: {scheduler_args: \"--a=1 --b\"}\n"),
              HasSubstr("the same as scheduler_args"));
  EXPECT_THAT(error("compare: {scheduler_args: \"\"}\n"), HasSubstr("the same as scheduler_args"));
  EXPECT_THAT(error("compare: {scheduler_args: --a, label: x, primary_label: x}\n"),
              HasSubstr("label and primary_label must be non-empty and differ"));
  EXPECT_THAT(error("compare: {scheduler_args: --a, label: \"\"}\n"),
              HasSubstr("must be non-empty"));
  EXPECT_THAT(error("compare: {scheduler_args: --a, labels: x}\n"),
              HasSubstr("compare.labels: unknown key"));
  EXPECT_THAT(error("compare: {scheduler_args: --a, label: {a: 1}}\n"),
              HasSubstr("compare.label: want a string"));
  EXPECT_THAT(error("scheduler_args: [--a]\n"), HasSubstr("scheduler_args: want a string"));
  EXPECT_TRUE(ParseScenario("compare: {scheduler_args: --a}\n").ok());
}

TEST(ScenarioTest, RejectsWhatItCannotRun) {
  EXPECT_THAT(ParseScenario("nodes: 3\n").status().message(), HasSubstr("nodes: unknown key"));
  EXPECT_THAT(ParseScenario("duration: soon\n").status().message(), HasSubstr("duration"));
  EXPECT_THAT(ParseScenario("faults: [{kind: meteor, at: 1s}]\n").status().message(),
              HasSubstr("unknown fault \"meteor\""));
  EXPECT_THAT(
      ParseScenario("faults: [{kind: error_storm, at: 1s, code: 404}]\n").status().message(),
      HasSubstr("code"));
  EXPECT_THAT(ParseScenario("workload: {shapes: {huge: 1}}\n").status().message(),
              HasSubstr("unknown shape"));
  EXPECT_THAT(ParseScenario("cluster: {gpu_types: [A, B], devmem_mib: [1]}\n").status().message(),
              HasSubstr("gpu_types"));
  EXPECT_THAT(ParseScenario("[1, 2]").status().message(), HasSubstr("want a YAML map"));
  EXPECT_TRUE(absl::IsNotFound(LoadScenario("/nonexistent/scenario.yaml").status()));
}

}  // namespace
}  // namespace tessera::sim
