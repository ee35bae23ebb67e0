#include "tessera/testing/objects.h"

#include <utility>

namespace tessera::testing {

device::DeviceInfo GpuDevice(std::string id, int32_t index, int32_t devmem, std::string type,
                             int32_t count, int32_t devcore) {
  device::DeviceInfo d;
  d.id = std::move(id);
  d.index = index;
  d.count = count;
  d.devmem = devmem;
  d.devcore = devcore;
  d.type = std::move(type);
  return d;
}

std::vector<device::MigProfile> A100MigProfiles() {
  using device::MigPlacement;
  return {
      {"1g.5gb", 4864, 15, 1, {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}}},
      {"2g.10gb", 9856, 29, 2, {{0, 2}, {2, 2}, {4, 2}}},
      {"3g.20gb", 19968, 43, 3, {{0, 4}, {4, 4}}},
      {"7g.40gb", 40192, 100, 7, {MigPlacement{0, 8}}},
  };
}

std::shared_ptr<const device::NodeDevices> MigNodeDevices(std::string node,
                                                          const std::vector<std::string>& uuids) {
  auto n = std::make_shared<device::NodeDevices>();
  n->node = std::move(node);
  for (size_t i = 0; i < uuids.size(); ++i) {
    device::DeviceInfo d =
        GpuDevice(uuids[i], static_cast<int32_t>(i), 40960, "NVIDIA A100-SXM4-40GB", 7);
    d.mode = "mig";
    d.mig_profiles = A100MigProfiles();
    n->devices.push_back(std::move(d));
  }
  return n;
}

std::shared_ptr<const device::NodeDevices> GpuNodeDevices(std::string node,
                                                          const std::vector<std::string>& uuids,
                                                          int32_t devmem, const std::string& type,
                                                          int32_t count, int32_t devcore) {
  auto n = std::make_shared<device::NodeDevices>();
  n->node = std::move(node);
  for (size_t i = 0; i < uuids.size(); ++i) {
    n->devices.push_back(
        GpuDevice(uuids[i], static_cast<int32_t>(i), devmem, type, count, devcore));
  }
  return n;
}

std::string MinimalPodJson(const std::string& name, const std::string& ns) {
  return R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":")" + name + R"(","namespace":")" +
         ns + R"("},"spec":{"containers":[{"name":"c","image":"x"}]}})";
}

kube::Node GpuNode(std::string name, std::string register_value) {
  kube::Node node;
  node.meta.name = std::move(name);
  node.meta.uid = "uid-" + node.meta.name;
  node.meta.annotations.Set("hami.io/node-nvidia-register", std::move(register_value));
  node.ready = kube::ConditionStatus::kTrue;
  return node;
}

kube::Container GpuContainer(std::string name, const std::string& count, const std::string& mem,
                             const std::string& cores) {
  kube::Container c;
  c.name = std::move(name);
  if (!count.empty()) {
    c.limits.Set("nvidia.com/gpu", count);
  }
  if (!mem.empty()) {
    c.limits.Set("nvidia.com/gpumem", mem);
  }
  if (!cores.empty()) {
    c.limits.Set("nvidia.com/gpucores", cores);
  }
  return c;
}

kube::Pod AllocatedPod(std::string name, const std::string& node, std::string allocated) {
  kube::Pod pod;
  pod.meta.ns = "ml";
  pod.meta.name = std::move(name);
  pod.meta.uid = "uid-" + pod.meta.name;
  pod.node_name = node;
  pod.phase = kube::PodPhase::kRunning;
  if (!allocated.empty()) {
    pod.meta.annotations.Set("hami.io/vgpu-node", node);
    pod.meta.annotations.Set("hami.io/vgpu-devices-allocated", std::move(allocated));
    pod.meta.annotations.Set("hami.io/vgpu-devices-to-allocate", ";");
    pod.meta.annotations.Set("hami.io/bind-phase", "success");
  }
  pod.containers.push_back(GpuContainer("main", "1", "1000", "10"));
  return pod;
}

kube::ResourceQuota GpuMemQuota(const std::string& ns, const std::string& name,
                                const std::string& mem) {
  kube::ResourceQuota q;
  q.meta.ns = ns;
  q.meta.name = name;
  q.hard.Set("limits.nvidia.com/gpumem", kube::ShortString(mem));
  return q;
}

}  // namespace tessera::testing
