// File: tessera/sim/cluster_setup.h
//
// The objects a `tessera simulate` run creates before its workload starts: the scenario's quota
// namespaces (each with its ResourceQuota "gpu") and its nodes, each with a device plugin that
// registers its GPUs (JSON or the v2.5 delimited format; on MIG nodes HAMi v2.10's `mig` mode).
// On the real control plane a namespace also gets its default ServiceAccount and a node its
// Ready status through the status subresource.
//
// Errors: the first failed API call, as the client returned it.
//
// Thread safety: the functions share no state; the transports and client must be usable.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "tessera/base/clock.h"
#include "tessera/kube/client.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/run_book.h"
#include "tessera/sim/scenario.h"

namespace tessera::sim {

absl::Status CreateQuotaNamespaces(const Scenario& scenario, bool real, kube::Transport& api);
// The PriorityClasses of the scenario's priorities, on the real control plane (apisim admits a
// pod's spec.priority as it is and serves no scheduling.k8s.io).
absl::Status CreatePriorityClasses(const Scenario& scenario, bool real, kube::Transport& api);

// The scenario's nodes, created and registered (the first handshake report of a v2.5 plugin
// due 30 s later).
absl::StatusOr<std::vector<SimNode>> CreateScenarioNodes(const Scenario& scenario, bool real,
                                                         kube::Transport& api,
                                                         kube::ApiClient& client, Clock* clock);

}  // namespace tessera::sim
