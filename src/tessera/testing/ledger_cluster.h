// File: tessera/testing/ledger_cluster.h
//
// Test-only (library tessera::testing). A synthetic cluster in the ledger's own types, for the
// ledger's memory test and the ledger and metrics benchmarks: node n is "gpu-worker-<n>" with
// `gpus` A100-80GB devices (UUIDs from GpuUuid); pod i has a 36-character UID, a realistic
// namespace and name, and is bound to node i % nodes. One pod in ten has two containers (one GPU
// each), the rest one.
#pragma once

#include <memory>
#include <string>

#include "tessera/device/model.h"
#include "tessera/ledger/ledger.h"

namespace tessera::testing {

std::string ClusterNodeName(int n);
std::string ClusterGpuUuid(int node, int gpu);
std::shared_ptr<const device::NodeDevices> ClusterNode(int n, int gpus);
// `generation` shifts the pod's device and memory (a re-allocation of the same pod).
ledger::PodAllocation ClusterPod(int i, int nodes, int gpus, int generation = 0);

}  // namespace tessera::testing
