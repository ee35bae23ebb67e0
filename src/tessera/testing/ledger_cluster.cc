#include "tessera/testing/ledger_cluster.h"

#include <cstdio>
#include <vector>

#include "tessera/testing/objects.h"

namespace tessera::testing {

std::string ClusterNodeName(int n) { return "gpu-worker-" + std::to_string(n); }

std::string ClusterGpuUuid(int node, int gpu) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "GPU-%08x-%04x-%04x-%04x-%012x", static_cast<unsigned>(node),
                static_cast<unsigned>(gpu), 0xa25bu, 0xcf5cu,
                static_cast<unsigned>(node * 8 + gpu));
  return buf;
}

std::shared_ptr<const device::NodeDevices> ClusterNode(int n, int gpus) {
  std::vector<std::string> uuids;
  uuids.reserve(static_cast<size_t>(gpus));
  for (int g = 0; g < gpus; ++g) {
    uuids.push_back(ClusterGpuUuid(n, g));
  }
  return GpuNodeDevices(ClusterNodeName(n), uuids, 81920, "NVIDIA A100-SXM4-80GB");
}

ledger::PodAllocation ClusterPod(int i, int nodes, int gpus, int generation) {
  ledger::PodAllocation p;
  char uid[40];
  std::snprintf(uid, sizeof(uid), "%08x-%04x-4%03x-8%03x-%012x", static_cast<unsigned>(i),
                static_cast<unsigned>(i & 0xffff), 0x1a2u, 0x3b4u, static_cast<unsigned>(i));
  p.uid = uid;
  p.ns = "team-ml-" + std::to_string(i % 20);
  p.name = "train-resnet-7f9c8d6b5-" + std::to_string(100000 + i);
  const int n = i % nodes;
  p.node = ClusterNodeName(n);
  p.bound_node = p.node;
  const int g = (i / nodes + generation) % gpus;
  p.devices.push_back(
      {device::ContainerDevice{ClusterGpuUuid(n, g), "NVIDIA", 4096 + 1024 * generation, 10}});
  if (i % 10 == 0) {
    p.devices.push_back(
        {device::ContainerDevice{ClusterGpuUuid(n, (g + 1) % gpus), "NVIDIA", 2048, 5}});
  }
  return p;
}

}  // namespace tessera::testing
