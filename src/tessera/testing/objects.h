// File: tessera/testing/objects.h
//
// Test-only (library tessera::testing). Builders of small Kubernetes objects carrying HAMi
// annotations, as kube::Node / kube::Pod projections:
//
//   kube::Node n = testing::GpuNode("node-a", register_annotation);
//   kube::Pod p = testing::AllocatedPod("p1", "node-a", "GPU-0,NVIDIA,1000,10:;");
//
// Names get "uid-<name>" UIDs; pods live in namespace "ml" and run.
#pragma once

#include <string>

#include "tessera/kube/objects.h"

namespace tessera::testing {

// A Ready node whose hami.io/node-nvidia-register annotation is `register_value`.
kube::Node GpuNode(std::string name, std::string register_value);

// A container limiting nvidia.com/gpu, gpumem and gpucores (an empty value: no such limit).
kube::Container GpuContainer(std::string name, std::string count, std::string mem,
                             std::string cores);

// A running pod bound to `node` whose allocation is `allocated` (the
// hami.io/vgpu-devices-allocated value; empty: no HAMi annotations), one container "main" of
// 1 GPU, 1000 MiB, 10 cores.
kube::Pod AllocatedPod(std::string name, std::string node, std::string allocated);

}  // namespace tessera::testing
