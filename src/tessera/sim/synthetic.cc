#include "tessera/sim/synthetic.h"

#include <algorithm>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/status_macros.h"

namespace tessera::sim {

std::string NodeName(int index) { return fmt::format("node-{:05d}", index); }

std::string GpuUuid(int node, int gpu) {
  return fmt::format("GPU-{:08x}-0000-4000-8000-{:012x}", node,
                     static_cast<uint64_t>(node) * 256 + static_cast<uint64_t>(gpu));
}

namespace {

std::string NodeJson(const SyntheticClusterOptions& o, int index) {
  nlohmann::json devices = nlohmann::json::array();
  for (int g = 0; g < o.gpus_per_node; ++g) {
    devices.push_back({{"id", GpuUuid(index, g)},
                       {"index", g},
                       {"count", o.slots},
                       {"devmem", o.devmem_mib},
                       {"devcore", 100},
                       {"type", o.gpu_type},
                       {"numa", g < o.gpus_per_node / 2 ? 0 : 1},
                       {"mode", "hami-core"},
                       {"health", true}});
  }
  nlohmann::json node = {{"apiVersion", "v1"},
                         {"kind", "Node"},
                         {"metadata",
                          {{"name", NodeName(index)},
                           {"uid", fmt::format("00000000-0000-4000-9000-{:012d}", index)},
                           {"labels", {{"kubernetes.io/hostname", NodeName(index)}, {"gpu", "on"}}},
                           {"annotations", {{"hami.io/node-nvidia-register", devices.dump()}}}}},
                         {"spec", nlohmann::json::object()},
                         {"status",
                          {{"allocatable",
                            {{"cpu", "64"},
                             {"memory", "512Gi"},
                             {"nvidia.com/gpu", std::to_string(o.gpus_per_node * o.slots)}}},
                           {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
  return node.dump();
}

nlohmann::json GpuContainer(const std::string& name, int gpus, int mem_mib, int cores) {
  return {{"name", name},
          {"image", "cuda:12"},
          {"resources",
           {{"limits",
             {{"nvidia.com/gpu", std::to_string(gpus)},
              {"nvidia.com/gpumem", std::to_string(mem_mib)},
              {"nvidia.com/gpucores", std::to_string(cores)}}}}}};
}

}  // namespace

SyntheticCluster GenerateCluster(const SyntheticClusterOptions& options) {
  SyntheticClusterOptions o = options;
  o.nodes = std::max(o.nodes, 0);
  o.gpus_per_node = std::max(o.gpus_per_node, 0);
  o.pods = (o.nodes == 0 || o.gpus_per_node == 0) ? 0 : std::max(o.pods, 0);
  SyntheticCluster c;
  c.ns = o.ns;
  c.nodes.reserve(o.nodes);
  for (int n = 0; n < o.nodes; ++n) {
    c.nodes.push_back(NodeJson(o, n));
  }
  const int64_t gpus = static_cast<int64_t>(o.nodes) * o.gpus_per_node;
  c.pods.reserve(o.pods);
  for (int p = 0; p < o.pods; ++p) {
    const int64_t slot = p % gpus;
    const int node = static_cast<int>(slot % o.nodes);
    const int gpu = static_cast<int>(slot / o.nodes);
    const std::string allocation =
        fmt::format("{},NVIDIA,{},{}:;", GpuUuid(node, gpu), o.pod_mem_mib, o.pod_cores);
    nlohmann::json pod = {{"apiVersion", "v1"},
                          {"kind", "Pod"},
                          {"metadata",
                           {{"name", fmt::format("job-{:06d}", p)},
                            {"uid", fmt::format("00000000-0000-4000-8000-{:012d}", p)},
                            {"namespace", o.ns},
                            {"labels", {{"app", "train"}, {"hami.io/vgpu-node", NodeName(node)}}},
                            {"annotations",
                             {{"hami.io/vgpu-node", NodeName(node)},
                              {"hami.io/vgpu-time", "1800000000"},
                              {"hami.io/vgpu-devices-allocated", allocation},
                              {"hami.io/vgpu-devices-to-allocate", ";"},
                              {"hami.io/bind-phase", "success"},
                              {"hami.io/bind-time", "1800000001"}}}}},
                          {"spec",
                           {{"nodeName", NodeName(node)},
                            {"schedulerName", "hami-scheduler"},
                            {"containers", {GpuContainer("main", 1, o.pod_mem_mib, o.pod_cores)}}}},
                          {"status", {{"phase", "Running"}}}};
    c.pods.push_back(pod.dump());
  }
  return c;
}

std::string PendingPodJson(const std::string& ns, const std::string& name, int gpus, int mem_mib,
                           int cores) {
  nlohmann::json pod = {{"apiVersion", "v1"},
                        {"kind", "Pod"},
                        {"metadata", {{"name", name}, {"namespace", ns}}},
                        {"spec",
                         {{"schedulerName", "hami-scheduler"},
                          {"containers", {GpuContainer("main", gpus, mem_mib, cores)}}}},
                        {"status", {{"phase", "Pending"}}}};
  return pod.dump();
}

absl::Status Populate(apisim::Store& store, const SyntheticCluster& cluster) {
  const apisim::ResourceInfo* namespaces = apisim::FindResource("", "v1", "namespaces");
  const apisim::ResourceInfo* nodes = apisim::FindResource("", "v1", "nodes");
  const apisim::ResourceInfo* pods = apisim::FindResource("", "v1", "pods");
  if (namespaces == nullptr || nodes == nullptr || pods == nullptr) {
    return absl::InternalError("the simulator does not serve namespaces, nodes and pods");
  }
  store.EnsureDefaultNamespaces();
  if (!store.Get(*namespaces, "", cluster.ns).ok()) {
    nlohmann::json ns = {
        {"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", cluster.ns}}}};
    TESSERA_RETURN_IF_ERROR(store.Create(*namespaces, "", ns.dump()).status());
  }
  for (const std::string& node : cluster.nodes) {
    TESSERA_RETURN_IF_ERROR(store.Create(*nodes, "", node).status());
  }
  for (const std::string& pod : cluster.pods) {
    TESSERA_RETURN_IF_ERROR(store.Create(*pods, cluster.ns, pod).status());
  }
  return absl::OkStatus();
}

}  // namespace tessera::sim
