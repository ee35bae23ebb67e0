// File: tessera/extender/disruption_budgets.h
//
// Which candidate victims on a node would violate a PodDisruptionBudget, by kube-scheduler's
// rule: walking the pods from the most important, each budget whose selector matches a pod (and
// that does not already count it as disrupted) spends one of its status.disruptionsAllowed; a pod
// that meets a budget with none left violates it. kube-scheduler skips a budget with an empty or
// absent selector, and so does this.
//
// Tessera keeps no pod labels (kube/objects.h), so the API server applies each selector: one
// LIST of the budgets per namespace among the pods, and per budget one LIST of the pods it selects
// on the node (labelSelector and fieldSelector spec.nodeName).
//
// Errors: the API's (the budgets could not be read: the caller must not guess) or
// InvalidArgument for a selector that cannot be written as a selector string.
// Thread safety: a free function; the client must be thread-safe.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"

namespace tessera::extender {

// `pods` are on `node`, most important first. The result is parallel to `pods`.
absl::StatusOr<std::vector<bool>> BudgetViolations(kube::ApiClient* client, std::string_view node,
                                                   const std::vector<const kube::Pod*>& pods);

}  // namespace tessera::extender
