#include "tessera/extender/disruption_budgets.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"

#include "tessera/base/status_macros.h"

namespace tessera::extender {
namespace {

// One budget: how many disruptions it still allows, and the uids of the pods it selects on the
// node that it does not already count as disrupted.
struct Budget {
  int64_t allowed = 0;
  absl::flat_hash_set<std::string> selects;
};

// The budgets of namespace `ns` that select pods on `node`.
absl::StatusOr<std::vector<Budget>> BudgetsOn(kube::ApiClient* client, const std::string& ns,
                                              std::string_view node) {
  kube::ListOptions budgets;
  budgets.ns = ns;
  TESSERA_ASSIGN_OR_RETURN(kube::PodDisruptionBudgetList list,
                           client->ListPodDisruptionBudgets(budgets));
  std::vector<Budget> out;
  for (const kube::PodDisruptionBudget& pdb : list.items) {
    if (!pdb.selector || pdb.selector->Empty()) {
      continue;
    }
    kube::ListOptions selected;
    selected.ns = ns;
    TESSERA_ASSIGN_OR_RETURN(selected.label_selector, kube::SelectorText(*pdb.selector));
    selected.field_selector = "spec.nodeName=" + std::string(node);
    TESSERA_ASSIGN_OR_RETURN(kube::PodList pods, client->ListPods(selected));
    Budget& budget = out.emplace_back();
    budget.allowed = pdb.disruptions_allowed;
    for (const kube::Pod& pod : pods.items) {
      if (!std::binary_search(pdb.disrupted_pods.begin(), pdb.disrupted_pods.end(),
                              pod.meta.name)) {
        budget.selects.insert(pod.meta.uid);
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<bool>> BudgetViolations(kube::ApiClient* client, std::string_view node,
                                                   const std::vector<const kube::Pod*>& pods) {
  std::map<std::string, std::vector<Budget>> by_ns;
  for (const kube::Pod* pod : pods) {
    if (!by_ns.contains(pod->meta.ns)) {
      TESSERA_ASSIGN_OR_RETURN(by_ns[pod->meta.ns], BudgetsOn(client, pod->meta.ns, node));
    }
  }
  std::vector<bool> out(pods.size(), false);
  for (size_t i = 0; i < pods.size(); ++i) {
    for (Budget& budget : by_ns[pods[i]->meta.ns]) {
      if (budget.selects.contains(pods[i]->meta.uid) && --budget.allowed < 0) {
        out[i] = true;
      }
    }
  }
  return out;
}

}  // namespace tessera::extender
