#include "tessera/explain/live.h"

#include <string>
#include <utility>

#include "tessera/base/status_macros.h"

namespace tessera::explain {
namespace {

// Lists every object of one kind; `list_page` is ApiClient::ListNodes or ListPods.
template <typename T, typename ListPage>
absl::StatusOr<std::vector<T>> ListAll(const ListClusterOptions& options, ListPage list_page) {
  for (int attempt = 0;; ++attempt) {
    std::vector<T> out;
    kube::ListOptions page;
    page.limit = options.page_size > 0 ? options.page_size : 0;
    absl::Status failure;
    while (true) {
      auto got = list_page(page);
      if (!got.ok()) {
        failure = got.status();
        break;
      }
      for (T& item : got->items) {
        out.push_back(std::move(item));
      }
      if (got->meta.continue_token.empty()) {
        return out;
      }
      page.continue_token = got->meta.continue_token;
    }
    // An expired continue token: the snapshot is gone, start over. A first page cannot expire.
    if (!absl::IsOutOfRange(failure) || page.continue_token.empty() ||
        attempt >= options.max_restarts) {
      return failure;
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<kube::Node>> ListAllNodes(kube::ApiClient& client,
                                                     const ListClusterOptions& options) {
  absl::StatusOr<std::vector<kube::Node>> nodes = ListAll<kube::Node>(
      options, [&client](const kube::ListOptions& o) { return client.ListNodes(o); });
  if (!nodes.ok()) {
    return Annotate(nodes.status(), "listing nodes");
  }
  return nodes;
}

absl::StatusOr<std::vector<kube::Pod>> ListAllPods(kube::ApiClient& client,
                                                   const ListClusterOptions& options) {
  absl::StatusOr<std::vector<kube::Pod>> pods = ListAll<kube::Pod>(
      options, [&client](const kube::ListOptions& o) { return client.ListPods(o); });
  if (!pods.ok()) {
    return Annotate(pods.status(), "listing pods");
  }
  return pods;
}

absl::StatusOr<std::vector<kube::ResourceQuota>> ListAllResourceQuotas(
    kube::ApiClient& client, const ListClusterOptions& options) {
  absl::StatusOr<std::vector<kube::ResourceQuota>> quotas = ListAll<kube::ResourceQuota>(
      options, [&client](const kube::ListOptions& o) { return client.ListResourceQuotas(o); });
  if (!quotas.ok()) {
    return Annotate(quotas.status(), "listing resourcequotas");
  }
  return quotas;
}

absl::StatusOr<LiveCluster> ListCluster(kube::ApiClient& client,
                                        const ListClusterOptions& options) {
  LiveCluster live;
  TESSERA_ASSIGN_OR_RETURN(live.nodes, ListAllNodes(client, options));
  TESSERA_ASSIGN_OR_RETURN(live.pods, ListAllPods(client, options));
  absl::StatusOr<std::vector<kube::ResourceQuota>> quotas = ListAllResourceQuotas(client, options);
  if (quotas.ok()) {
    live.quotas = *std::move(quotas);
  } else {
    live.quota_error = std::string(quotas.status().message());
  }
  return live;
}

}  // namespace tessera::explain
