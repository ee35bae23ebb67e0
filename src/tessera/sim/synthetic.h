// File: tessera/sim/synthetic.h
//
// Synthetic clusters of HAMi GPU nodes and pods, as the Kubernetes JSON a real API server holds:
// nodes with a v2.8+ JSON registration (hami.io/node-nvidia-register), Ready and a non-zero
// allocatable nvidia.com/gpu; pods bound to them carrying the annotations HAMi's scheduler
// writes (hami.io/vgpu-node, hami.io/vgpu-devices-allocated, bind-phase success). Used by
// `tessera bench serve`, the serve integration tests and `tessera simulate`.
//
//   SyntheticCluster c = GenerateCluster({.nodes = 5000, .gpus_per_node = 8, .pods = 100000});
//   TESSERA_RETURN_IF_ERROR(Populate(store, c));
//
// Objects carry a uid so they can be decoded and projected directly; an API server (apisim)
// assigns its own on create. Placement is deterministic: pod i takes one GPU, the GPUs in
// round-robin order over the whole cluster, so usage is spread evenly and never exceeds a device's
// slots or memory when pods ≤ nodes × gpus × min(slots, devmem / pod_mem).
//
// Thread safety: pure functions; Populate calls the (internally synchronised) store.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

#include "tessera/apisim/store.h"

namespace tessera::sim {

struct SyntheticClusterOptions {
  int nodes = 5000;
  int gpus_per_node = 8;
  int pods = 100000;       // bound pods holding one GPU share each
  int devmem_mib = 32768;  // per GPU
  int slots = 10;          // shares per GPU (the registration's "count")
  int pod_mem_mib = 2000;  // per bound pod
  int pod_cores = 10;      // per bound pod (percent)
  std::string gpu_type = "NVIDIA-A100";
  std::string ns = "gpu";  // namespace of the pods
};

struct SyntheticCluster {
  std::vector<std::string> nodes;  // Node JSON objects
  std::vector<std::string> pods;   // Pod JSON objects
  std::string ns;
};

// "node-00042" (five digits, so names sort as numbers).
std::string NodeName(int index);
// "GPU-<8 hex of node>-0000-4000-8000-<12 hex of node*256+gpu>": unique and HAMi-shaped.
std::string GpuUuid(int node, int gpu);

// InvalidArgument-free: options are clamped to be non-negative.
SyntheticCluster GenerateCluster(const SyntheticClusterOptions& options);

// A Pending, unscheduled pod asking for `gpus` GPUs of `mem_mib` MiB and `cores` percent each,
// for kube-scheduler's extender calls (schedulerName hami-scheduler).
std::string PendingPodJson(const std::string& ns, const std::string& name, int gpus, int mem_mib,
                           int cores);

// Creates the namespace and every node and pod in `store`. Stops at the first error.
absl::Status Populate(apisim::Store& store, const SyntheticCluster& cluster);

}  // namespace tessera::sim
