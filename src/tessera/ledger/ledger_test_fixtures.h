// File: tessera/ledger/ledger_test_fixtures.h
//
// A synthetic cluster for the ledger's memory test and benchmark: node i is "node-<i>" with
// `gpus` devices GPU-<uuid-like>; pod i has a 36-character UID, a realistic namespace and name,
// and is bound to node i % nodes. One pod in ten has two containers (one GPU each), the rest one.
// Test-only (header-only, no library target).
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "tessera/device/model.h"
#include "tessera/ledger/ledger.h"

namespace tessera::ledger::testing {

inline std::string NodeName(int n) { return "gpu-worker-" + std::to_string(n); }

inline std::string GpuUuid(int node, int gpu) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "GPU-%08x-%04x-%04x-%04x-%012x", static_cast<unsigned>(node),
                static_cast<unsigned>(gpu), 0xa25bu, 0xcf5cu,
                static_cast<unsigned>(node * 8 + gpu));
  return buf;
}

inline std::shared_ptr<const device::NodeDevices> ClusterNode(int n, int gpus) {
  auto node = std::make_shared<device::NodeDevices>();
  node->node = NodeName(n);
  for (int g = 0; g < gpus; ++g) {
    device::DeviceInfo d;
    d.id = GpuUuid(n, g);
    d.index = g;
    d.count = 10;
    d.devmem = 81920;
    d.devcore = 100;
    d.type = "NVIDIA A100-SXM4-80GB";
    node->devices.push_back(d);
  }
  return node;
}

inline PodAllocation ClusterPod(int i, int nodes, int gpus, int generation = 0) {
  PodAllocation p;
  char uid[40];
  std::snprintf(uid, sizeof(uid), "%08x-%04x-4%03x-8%03x-%012x", static_cast<unsigned>(i),
                static_cast<unsigned>(i & 0xffff), 0x1a2u, 0x3b4u, static_cast<unsigned>(i));
  p.uid = uid;
  p.ns = "team-ml-" + std::to_string(i % 20);
  p.name = "train-resnet-7f9c8d6b5-" + std::to_string(100000 + i);
  const int n = i % nodes;
  p.node = NodeName(n);
  p.bound_node = p.node;
  const int g = (i / nodes + generation) % gpus;
  p.devices.push_back(
      {device::ContainerDevice{GpuUuid(n, g), "NVIDIA", 4096 + 1024 * generation, 10}});
  if (i % 10 == 0) {
    p.devices.push_back({device::ContainerDevice{GpuUuid(n, (g + 1) % gpus), "NVIDIA", 2048, 5}});
  }
  return p;
}

}  // namespace tessera::ledger::testing
