#include "tessera/device/vendor.h"

#include <optional>
#include <string>
#include <string_view>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/other_vendors.h"

namespace tessera::device {
namespace {

TEST(NvidiaVendorTest, KeysAndManagedResources) {
  std::unique_ptr<Vendor> v = NewNvidiaVendor(DefaultNvidiaConfig());
  EXPECT_EQ(v->Key(), "NVIDIA");
  EXPECT_EQ(v->RegisterAnnotation(), "hami.io/node-nvidia-register");
  EXPECT_EQ(v->HandshakeAnnotation(), "hami.io/node-handshake");
  EXPECT_EQ(v->ToAllocateAnnotation(), "hami.io/vgpu-devices-to-allocate");
  EXPECT_EQ(v->AllocatedAnnotation(), "hami.io/vgpu-devices-allocated");
  EXPECT_THAT(
      v->ManagedResources(),
      ::testing::UnorderedElementsAre("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores",
                                      "nvidia.com/gpumem-percentage", "nvidia.com/priority"));
}

TEST(NvidiaVendorTest, AllocationRoundTripAndFilterAnnotations) {
  std::unique_ptr<Vendor> v = NewNvidiaVendor(DefaultNvidiaConfig());
  PodDevices devices = {{}, {{"GPU-a", "NVIDIA", 3000, 30}}, {}};
  const std::string encoded = v->EncodeAllocation(devices);
  EXPECT_EQ(encoded, ";GPU-a,NVIDIA,3000,30:;;");
  kube::Pod pod;
  pod.meta.ns = "ns";
  pod.meta.name = "p";
  EXPECT_TRUE(absl::IsNotFound(v->DecodeAllocation(pod).status()));
  pod.meta.annotations.Set("hami.io/vgpu-devices-allocated", encoded);
  absl::StatusOr<PodDevices> decoded = v->DecodeAllocation(pod);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, devices);

  kube::StringMap a =
      FilterAnnotations(*v, kube::Pod{}, "node-1", devices, absl::FromUnixSeconds(1705054796));
  EXPECT_EQ(a, (kube::StringMap{{"hami.io/vgpu-node", "node-1"},
                                {"hami.io/vgpu-time", "1705054796"},
                                {"hami.io/vgpu-devices-to-allocate", encoded},
                                {"hami.io/vgpu-devices-allocated", encoded}}));
  EXPECT_EQ(FilterLabels("node-1"), (kube::StringMap{{"hami.io/vgpu-node", "node-1"}}));
}

// The non-NVIDIA managedResources of HAMi's chart, v2.10.0 (Ascend and Iluvatar when enabled)
// and v2.5.2 (Iluvatar's names), charts/hami/templates/scheduler/configmap.yaml, and some of the
// resource names its values.yaml gives the Ascend, Iluvatar and Cambricon devices.
constexpr std::string_view kChartOtherResources[] = {"cambricon.com/vmlu",
                                                     "hygon.com/dcunum",
                                                     "hygon.com/dcumem",
                                                     "hygon.com/dcucores",
                                                     "metax-tech.com/gpu",
                                                     "metax-tech.com/sgpu",
                                                     "metax-tech.com/vcore",
                                                     "metax-tech.com/vmemory",
                                                     "mthreads.com/vgpu",
                                                     "enflame.com/drs-gcu",
                                                     "enflame.com/gcu-memory",
                                                     "enflame.com/gcu-core",
                                                     "enflame.com/gcu",
                                                     "kunlunxin.com/xpu",
                                                     "kunlunxin.com/vxpu",
                                                     "kunlunxin.com/vxpu-memory",
                                                     "aws.amazon.com/neuron",
                                                     "aws.amazon.com/neuroncore",
                                                     "vastaitech.com/va",
                                                     "birentech.com/gpu",
                                                     "amd.com/gpu",
                                                     "amd.com/gpumem",
                                                     "amd.com/gpucores",
                                                     "huawei.com/Ascend910B",
                                                     "huawei.com/Ascend910B-memory",
                                                     "iluvatar.ai/vgpu",
                                                     "iluvatar.ai/vcuda-memory",
                                                     "iluvatar.ai/vcuda-core",
                                                     "iluvatar.ai/BI-V150-vgpu",
                                                     "iluvatar.ai/MR-V50.vMem",
                                                     "huawei.com/Ascend310P-core",
                                                     "huawei.com/Ascend910B4-1-memory",
                                                     "cambricon.com/mlu.smlu.vcore",
                                                     "cambricon.com/mlu.smlu.vmemory"};

kube::Pod PodAsking(std::string_view resource, bool in_requests = false, bool init = false) {
  kube::Pod pod;
  pod.meta.ns = "ns";
  pod.meta.name = "p";
  kube::Container c;
  c.name = "main";
  (in_requests ? c.requests : c.limits).Set("cpu", "1");
  (in_requests ? c.requests : c.limits).Set(std::string(resource), "1");
  (init ? pod.init_containers : pod.containers).push_back(c);
  return pod;
}

TEST(NvidiaVendorTest, EveryOtherVendorResourceOfHamisChartIsRefusedNamingTheVendor) {
  std::unique_ptr<Vendor> v = NewNvidiaVendor(DefaultNvidiaConfig());
  for (std::string_view resource : kChartOtherResources) {
    std::optional<std::string_view> vendor = OtherVendorOf(resource);
    ASSERT_TRUE(vendor.has_value()) << resource;
    absl::StatusOr<PodRequest> r = v->DecodeRequest(PodAsking(resource));
    ASSERT_FALSE(r.ok()) << resource;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << resource;
    EXPECT_THAT(r.status().message(), ::testing::HasSubstr(std::string(resource)));
    EXPECT_THAT(r.status().message(),
                ::testing::HasSubstr(std::string(*vendor) + " devices are not supported"));
    EXPECT_THAT(r.status().message(), ::testing::HasSubstr("pod ns/p: container \"main\""));
  }
  EXPECT_EQ(OtherVendorOf("cambricon.com/vmlu"), "Cambricon MLU");
  EXPECT_EQ(OtherVendorOf("huawei.com/Ascend310P"), "Huawei Ascend");
}

TEST(NvidiaVendorTest, RequestsAndInitContainersAreCheckedToo) {
  std::unique_ptr<Vendor> v = NewNvidiaVendor(DefaultNvidiaConfig());
  absl::StatusOr<PodRequest> requests = v->DecodeRequest(PodAsking("hygon.com/dcunum", true));
  EXPECT_THAT(requests.status().message(), ::testing::HasSubstr("Hygon DCU"));
  absl::StatusOr<PodRequest> init = v->DecodeRequest(PodAsking("amd.com/gpu", false, true));
  EXPECT_THAT(init.status().message(), ::testing::HasSubstr("init container \"main\""));
  EXPECT_THAT(init.status().message(), ::testing::HasSubstr("AMD GPU"));
}

TEST(NvidiaVendorTest, NvidiaAndOrdinaryResourcesAreNotAnotherVendors) {
  for (std::string_view resource :
       {"nvidia.com/gpu", "nvidia.com/gpumem", "cpu", "memory", "ephemeral-storage",
        "example.com/foo", "huawei.com/npu-other", "amd.com/cpu"}) {
    EXPECT_EQ(OtherVendorOf(resource), std::nullopt) << resource;
  }
  std::unique_ptr<Vendor> v = NewNvidiaVendor(DefaultNvidiaConfig());
  absl::StatusOr<PodRequest> gpu = v->DecodeRequest(PodAsking("nvidia.com/gpu"));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->containers[0]->nums, 1);
  // A device config may give NVIDIA a name in another vendor's domain: it is NVIDIA's then.
  NvidiaConfig config = DefaultNvidiaConfig();
  config.resource_count_name = "amd.com/gpu";
  absl::StatusOr<PodRequest> renamed =
      NewNvidiaVendor(config)->DecodeRequest(PodAsking("amd.com/gpu"));
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_EQ(renamed->containers[0]->nums, 1);
}

TEST(NvidiaVendorTest, CustomResourceNamesFromTheDeviceConfig) {
  NvidiaConfig config = DefaultNvidiaConfig();
  config.resource_count_name = "example.com/vgpu";
  std::unique_ptr<Vendor> v = NewNvidiaVendor(config);
  kube::Pod pod;
  pod.meta.ns = "ns";
  pod.meta.name = "p";
  kube::Container c;
  c.name = "main";
  c.limits.Set("example.com/vgpu", "2");
  pod.containers.push_back(c);
  absl::StatusOr<PodRequest> r = v->DecodeRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->containers.size(), 1u);
  ASSERT_TRUE(r->containers[0].has_value());
  EXPECT_EQ(r->containers[0]->nums, 2);
  EXPECT_EQ(r->containers[0]->mem_percentage, 100);  // no memory given: the whole device
}

}  // namespace
}  // namespace tessera::device
