#include "tessera/extender/disruption_budgets.h"

#include <string>
#include <vector>

#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/apisim/store.h"
#include "tessera/kube/decode.h"
#include "tessera/testing/apisim_env.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;

class BudgetViolationsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(env_.Start()); }

  // Pod `ns`/`name` on `node` labelled `labels` (a JSON object); returns it as stored.
  kube::Pod Pod(const std::string& name, const std::string& node, const std::string& labels,
                const std::string& ns = "default") {
    absl::StatusOr<std::string> created = env_.store().Create(
        *apisim::FindResource("", "v1", "pods"), ns,
        fmt::format(R"({{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{}","labels":{}}},)"
                    R"("spec":{{"nodeName":"{}","containers":[{{"name":"c","image":"x"}}]}}}})",
                    name, labels, node));
    EXPECT_TRUE(created.ok()) << created.status();
    absl::StatusOr<kube::Pod> pod = kube::DecodePod(created.value_or("{}"));
    EXPECT_TRUE(pod.ok()) << pod.status();
    return pod.value_or(kube::Pod());
  }

  // A budget in `ns` with `selector` (JSON) allowing `allowed` disruptions; `disrupted` is the
  // JSON object of status.disruptedPods.
  void Budget(const std::string& name, const std::string& selector, int allowed,
              const std::string& ns = "default", const std::string& disrupted = "{}") {
    absl::StatusOr<std::string> created = env_.store().Create(
        *apisim::FindResource("policy", "v1", "poddisruptionbudgets"), ns,
        fmt::format(R"({{"apiVersion":"policy/v1","kind":"PodDisruptionBudget",)"
                    R"("metadata":{{"name":"{}"}},"spec":{{"minAvailable":1,"selector":{}}},)"
                    R"("status":{{"disruptionsAllowed":{},"disruptedPods":{}}}}})",
                    name, selector, allowed, disrupted));
    ASSERT_TRUE(created.ok()) << created.status();
  }

  std::vector<bool> Violations(const std::string& node, const std::vector<kube::Pod>& pods) {
    std::vector<const kube::Pod*> order;
    for (const kube::Pod& p : pods) {
      order.push_back(&p);
    }
    absl::StatusOr<std::vector<bool>> v = BudgetViolations(env_.client(), node, order);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.value_or(std::vector<bool>());
  }

  ::tessera::testing::ApisimEnv env_;
};

TEST_F(BudgetViolationsTest, EachMatchedPodSpendsOneDisruptionInImportanceOrder) {
  const kube::Pod a = Pod("a", "n1", R"({"app":"web"})");
  const kube::Pod b = Pod("b", "n1", R"({"app":"web"})");
  const kube::Pod c = Pod("c", "n1", R"({"app":"db"})");
  Budget("web", R"({"matchLabels":{"app":"web"}})", 1);
  // a spends the one disruption; b finds none left; c is not selected.
  EXPECT_THAT(Violations("n1", {a, b, c}), ElementsAre(false, true, false));
  EXPECT_THAT(Violations("n1", {b, a, c}), ElementsAre(false, true, false));
}

TEST_F(BudgetViolationsTest, ExpressionsAndOtherNamespacesAndDisruptedPods) {
  const kube::Pod a = Pod("a", "n1", R"({"tier":"gpu","canary":"yes"})");
  const kube::Pod b = Pod("b", "n1", R"({"tier":"gpu"})");
  const kube::Pod o = Pod("o", "n1", R"({"tier":"gpu"})", "kube-system");
  Budget("gpu",
         R"({"matchExpressions":[{"key":"tier","operator":"In","values":["gpu","tpu"]},)"
         R"({"key":"canary","operator":"DoesNotExist"}]})",
         0);
  EXPECT_THAT(Violations("n1", {a, b, o}), ElementsAre(false, true, false));
  // A budget that already counts b as disrupted does not count it again.
  Budget("again", R"({"matchLabels":{"tier":"gpu"}})", 0, "kube-system",
         R"({"o":"2026-12-07T12:00:00Z"})");
  EXPECT_THAT(Violations("n1", {o}), ElementsAre(false));
}

TEST_F(BudgetViolationsTest, AnEmptySelectorAndAnotherNodeSelectNothing) {
  const kube::Pod a = Pod("a", "n1", R"({"app":"web"})");
  const kube::Pod far = Pod("far", "n2", R"({"app":"web"})");
  Budget("all", "{}", 0);
  EXPECT_THAT(Violations("n1", {a}), ElementsAre(false));
  Budget("web", R"({"matchLabels":{"app":"web"}})", 0);
  EXPECT_THAT(Violations("n1", {a}), ElementsAre(true));
  EXPECT_THAT(Violations("n1", {far}), ElementsAre(false)) << "far runs on n2";
}

TEST_F(BudgetViolationsTest, AnUnreadableBudgetIsAnError) {
  const kube::Pod a = Pod("a", "n1", R"({"app":"web"})");
  env_.faults()->Inject("GET", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", 403,
                        "Forbidden");
  std::vector<const kube::Pod*> order = {&a};
  absl::StatusOr<std::vector<bool>> v = BudgetViolations(env_.client(), "n1", order);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(SelectorTextTest, EveryOperatorAndTheErrors) {
  kube::LabelSelector s;
  s.match_labels.Set("app", "web");
  s.match_expressions = {{"tier", "In", {"a", "b"}},
                         {"zone", "NotIn", {"x"}},
                         {"gpu", "Exists", {}},
                         {"canary", "DoesNotExist", {}}};
  absl::StatusOr<std::string> text = kube::SelectorText(s);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "app=web,tier in (a,b),zone notin (x),gpu,!canary");
  for (const kube::LabelSelectorRequirement& bad :
       std::vector<kube::LabelSelectorRequirement>{{"tier", "In", {}},
                                                   {"gpu", "Exists", {"x"}},
                                                   {"gpu", "Near", {}},
                                                   {"a,b", "Exists", {}},
                                                   {"tier", "In", {"a b"}}}) {
    kube::LabelSelector one;
    one.match_expressions = {bad};
    EXPECT_EQ(kube::SelectorText(one).status().code(), absl::StatusCode::kInvalidArgument)
        << bad.key << " " << bad.op;
  }
}

}  // namespace
}  // namespace tessera::extender
