// File: tessera/testing/objects.h
//
// Test-only (library tessera::testing_objects). Builders of devices, and of small Kubernetes
// objects carrying HAMi annotations as kube::Node / kube::Pod projections:
//
//   device::DeviceInfo d = testing::GpuDevice("GPU-0", 0, 16384);
//   auto devices = testing::GpuNodeDevices("node-a", {"GPU-0", "GPU-1"});
//   kube::Node n = testing::GpuNode("node-a", register_annotation);
//   kube::Pod p = testing::AllocatedPod("p1", "node-a", "GPU-0,NVIDIA,1000,10:;");
//
// Names get "uid-<name>" UIDs; pods live in namespace "ml" and run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/device/model.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/resource_quota.h"

namespace tessera::testing {

// A healthy device `id` at `index`: `count` shares of `devmem` MiB and `devcore` percent.
device::DeviceInfo GpuDevice(std::string id, int32_t index, int32_t devmem,
                             std::string type = "NVIDIA-Tesla T4", int32_t count = 10,
                             int32_t devcore = 100);

// Node `node`'s devices: GpuDevice(uuids[i], i, devmem, type, count, devcore) for each UUID.
std::shared_ptr<const device::NodeDevices> GpuNodeDevices(
    std::string node, const std::vector<std::string>& uuids, int32_t devmem = 16384,
    const std::string& type = "NVIDIA-Tesla T4", int32_t count = 10, int32_t devcore = 100);

// Node `node`'s A100-SXM4-40GB cards in "mig" mode as a v2.10 plugin registers them with the
// chart's allowlist (1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb): the protocol reference's worked example
// (count 7, devmem 40960, profiles 4864/15, 9856/29, 19968/43, 40192/100 MiB/cores).
std::shared_ptr<const device::NodeDevices> MigNodeDevices(std::string node,
                                                          const std::vector<std::string>& uuids);
std::vector<device::MigProfile> A100MigProfiles();

// The JSON of a pod `ns`/`name` with one container "c" (image "x") and nothing else.
std::string MinimalPodJson(const std::string& name, const std::string& ns = "default");

// A Ready node whose hami.io/node-nvidia-register annotation is `register_value`.
kube::Node GpuNode(std::string name, std::string register_value);

// A container limiting nvidia.com/gpu, gpumem and gpucores (an empty value: no such limit).
kube::Container GpuContainer(std::string name, const std::string& count, const std::string& mem,
                             const std::string& cores);

// A running pod bound to `node` whose allocation is `allocated` (the
// hami.io/vgpu-devices-allocated value; empty: no HAMi annotations), one container "main" of
// 1 GPU, 1000 MiB, 10 cores.
kube::Pod AllocatedPod(std::string name, const std::string& node, std::string allocated);

// A ResourceQuota `name` in `ns` limiting the namespace's GPU memory
// (limits.nvidia.com/gpumem) to `mem` MiB.
kube::ResourceQuota GpuMemQuota(const std::string& ns, const std::string& name,
                                const std::string& mem);

}  // namespace tessera::testing
