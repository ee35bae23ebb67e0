#include "tessera/sim/cluster_setup.h"

#include <memory>
#include <string>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/mig_geometry.h"
#include "tessera/sim/emulators.h"
#include "tessera/sim/quota_oracle.h"
#include "tessera/sim/synthetic.h"

namespace tessera::sim {

using nlohmann::json;

absl::Status CreateQuotaNamespaces(const Scenario& scenario, bool real, kube::Transport& api) {
  for (const QuotaNamespace& ns : scenario.namespaces) {
    TESSERA_RETURN_IF_ERROR(CreateNamespace(api, ns.name));
    if (real) {
      TESSERA_RETURN_IF_ERROR(CreateDefaultServiceAccount(api, ns.name));
    }
    std::vector<std::pair<std::string, std::string>> hard;
    if (ns.gpumem.has_value()) {
      hard.emplace_back(fmt::format("limits.{}", kQuotaMemoryResource), std::to_string(*ns.gpumem));
    }
    if (ns.gpucores.has_value()) {
      hard.emplace_back(fmt::format("limits.{}", kQuotaCoresResource),
                        std::to_string(*ns.gpucores));
    }
    if (!hard.empty()) {
      TESSERA_RETURN_IF_ERROR(CreateResourceQuota(api, ns.name, "gpu", hard));
    }
  }
  return absl::OkStatus();
}

absl::Status CreatePriorityClasses(const Scenario& scenario, bool real, kube::Transport& api) {
  if (!real) {
    return absl::OkStatus();
  }
  for (const auto& [value, weight] : scenario.priorities) {
    TESSERA_RETURN_IF_ERROR(CreatePriorityClass(api, value));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SimNode>> CreateScenarioNodes(const Scenario& scenario, bool real,
                                                         kube::Transport& api,
                                                         kube::ApiClient& client, Clock* clock) {
  std::vector<SimNode> nodes;
  const std::vector<bool> mig_nodes = scenario.MigNodes();
  size_t mig_index = 0;
  for (int i = 0; i < scenario.nodes; ++i) {
    const size_t type = static_cast<size_t>(i) % scenario.gpu_types.size();
    const device::MigGpuModel* model = nullptr;
    if (mig_nodes[static_cast<size_t>(i)]) {
      const std::string& name = scenario.mig_models[mig_index++ % scenario.mig_models.size()];
      for (const device::MigGpuModel& m : device::MigGpuModels()) {
        model = m.model == name ? &m : model;
      }
    }
    std::vector<device::DeviceInfo> devices;
    for (int g = 0; g < scenario.gpus_per_node; ++g) {
      device::DeviceInfo d;
      d.id = GpuUuid(i, g);
      d.index = g;
      d.count = scenario.slots;
      d.devmem = scenario.devmem_mib[type];
      d.devcore = 100;
      d.type = scenario.gpu_types[type];
      d.numa = g < scenario.gpus_per_node / 2 ? 0 : 1;
      if (model != nullptr) {
        // HAMi v2.10's plugin in `mig` mode: the model's NVML name, its whole memory, and the
        // profiles of its geometry (an allowlist of every profile); as many slots as 1g
        // instances fit (the plugin registers count = the card's maximum instances).
        d.type = fmt::format("NVIDIA {}", model->type_fragments.front());
        d.devmem = model->memory_mib;
        d.mode = "mig";
        d.mig_profiles = device::MigProfilesOf(*model);
        d.count = static_cast<int32_t>(model->profiles.front().max_instances);
      }
      devices.push_back(d);
    }
    const bool delimited = model == nullptr && scenario.IsDelimitedNode(i);
    SimNode n;
    n.name = NodeName(i);
    n.mig = model != nullptr;
    n.plugin = std::make_unique<DevicePlugin>(
        n.name, delimited ? device::RegisterFormat::kDelimited : device::RegisterFormat::kJson,
        devices);
    json node = {
        {"apiVersion", "v1"},
        {"kind", "Node"},
        {"metadata",
         {{"name", n.name}, {"labels", {{"kubernetes.io/hostname", n.name}, {"gpu", "on"}}}}},
        {"spec", json::object()},
        {"status",
         {{"allocatable",
           {{"cpu", "64"},
            {"memory", "512Gi"},
            {"nvidia.com/gpu", std::to_string(scenario.gpus_per_node * scenario.slots)}}},
          {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
    TESSERA_RETURN_IF_ERROR(CreateNode(api, node.dump()));
    if (real) {
      // A real API server takes the status only through its subresource, and tainted the node
      // not-ready; kube-scheduler needs `pods` in allocatable.
      json status = node["status"];
      status["allocatable"]["pods"] = "1000";
      status["capacity"] = status["allocatable"];
      const std::string now =
          absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", clock->Now(), absl::UTCTimeZone());
      status["conditions"] = {{{"type", "Ready"},
                               {"status", "True"},
                               {"reason", "KubeletReady"},
                               {"message", "tessera simulate's kubelet"},
                               {"lastHeartbeatTime", now},
                               {"lastTransitionTime", now}}};
      TESSERA_RETURN_IF_ERROR(MakeNodeReady(api, n.name, status.dump()));
    }
    TESSERA_RETURN_IF_ERROR(n.plugin->Register(client, clock->Now()));
    node["metadata"]["annotations"] = {
        {std::string(device::kNodeRegisterAnnotation), n.plugin->RegisterValue()}};
    n.json = node.dump();
    n.next_report = clock->Now() + absl::Seconds(30);
    nodes.push_back(std::move(n));
  }
  return nodes;
}

}  // namespace tessera::sim
