// File: tessera/explain/live.h
//
// Reading a whole cluster from the API server, for one-shot commands such as
// `tessera explain --kubeconfig`: every node and every pod, page by page, in the server's order.
// A long-running process uses informers instead (tessera/kube/informer.h).
//
//   kube::ApiClient client(transport.get());
//   absl::StatusOr<explain::LiveCluster> live = explain::ListCluster(client);
//
// Pages: the first LIST of each kind reads the current state (no resourceVersion, a consistent
// read); later pages follow the server's continue token. When a continue token has expired
// (410, kOutOfRange) the listing of that kind starts over, at most `max_restarts` times.
//
// Thread safety: pure functions of the client (which may be shared; see client.h). They block
// and must not run on the transport's I/O thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"

namespace tessera::explain {

struct ListClusterOptions {
  int64_t page_size = 500;  // limit= of each LIST; <= 0 asks for everything at once
  int max_restarts = 2;     // listings started over after an expired continue token
};

struct LiveCluster {
  std::vector<kube::Node> nodes;            // in the server's order (by name)
  std::vector<kube::Pod> pods;              // every namespace, in the server's order
  std::vector<kube::ResourceQuota> quotas;  // every namespace (namespace quota, docs/quota.md)
  // Why the ResourceQuotas could not be listed (then `quotas` is empty and no quota is checked);
  // empty when they were.
  std::string quota_error;
};

// Every node, then every pod. Errors are the client's (client.h), prefixed with "listing nodes"
// or "listing pods" and keeping the code.
absl::StatusOr<std::vector<kube::Node>> ListAllNodes(kube::ApiClient& client,
                                                     const ListClusterOptions& options = {});
absl::StatusOr<std::vector<kube::Pod>> ListAllPods(kube::ApiClient& client,
                                                   const ListClusterOptions& options = {});
absl::StatusOr<std::vector<kube::ResourceQuota>> ListAllResourceQuotas(
    kube::ApiClient& client, const ListClusterOptions& options = {});
// Nodes and pods as above (their errors are errors), then the ResourceQuotas (an error there,
// e.g. a user who may not list them, is `quota_error`).
absl::StatusOr<LiveCluster> ListCluster(kube::ApiClient& client,
                                        const ListClusterOptions& options = {});

}  // namespace tessera::explain
