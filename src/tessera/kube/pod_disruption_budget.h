// File: tessera/kube/pod_disruption_budget.h
//
// Projection of a policy/v1 PodDisruptionBudget: what preemption's victim rule reads
// (docs/preemption.md) — the pod selector, status.disruptionsAllowed and status.disruptedPods.
// Tessera does not keep pod labels (objects.h), so a selector is matched by the API server:
// SelectorText gives it in the labelSelector query form.
//
// Errors: SelectorText is InvalidArgument for an operator it does not know, In/NotIn without
// values, Exists/DoesNotExist with values, or a key or value a selector string cannot carry.
// Thread safety: plain values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/kube/objects.h"

namespace tessera::kube {

struct LabelSelectorRequirement {
  std::string key;
  std::string op;  // "In", "NotIn", "Exists", "DoesNotExist"
  std::vector<std::string> values;
  friend bool operator==(const LabelSelectorRequirement&,
                         const LabelSelectorRequirement&) = default;
};

struct LabelSelector {
  StringMap match_labels;
  std::vector<LabelSelectorRequirement> match_expressions;
  // Selects nothing in kube-scheduler's reading of a budget (it skips empty selectors).
  bool Empty() const { return match_labels.size() == 0 && match_expressions.empty(); }
  friend bool operator==(const LabelSelector&, const LabelSelector&) = default;
};

struct PodDisruptionBudget {
  ObjectMeta meta;                          // labels and annotations are not kept
  std::optional<LabelSelector> selector;    // spec.selector; nullopt when absent or null
  int32_t disruptions_allowed = 0;          // status.disruptionsAllowed
  std::vector<std::string> disrupted_pods;  // the names in status.disruptedPods, sorted
  friend bool operator==(const PodDisruptionBudget&, const PodDisruptionBudget&) = default;
};

// "app=web,tier in (a,b),!canary" (requirements sorted as the API server prints them does not
// matter: the server parses any order).
absl::StatusOr<std::string> SelectorText(const LabelSelector& selector);

}  // namespace tessera::kube
