#include "tessera/device/vendor.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

  kube::StringMap a = FilterAnnotations(*v, "node-1", devices, absl::FromUnixSeconds(1705054796));
  EXPECT_EQ(a, (kube::StringMap{{"hami.io/vgpu-node", "node-1"},
                                {"hami.io/vgpu-time", "1705054796"},
                                {"hami.io/vgpu-devices-to-allocate", encoded},
                                {"hami.io/vgpu-devices-allocated", encoded}}));
  EXPECT_EQ(FilterLabels("node-1"), (kube::StringMap{{"hami.io/vgpu-node", "node-1"}}));
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
