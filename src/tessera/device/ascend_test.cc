// Tests of the Ascend chip rules (ascend.h). Vectors: HAMi v2.10.0 pkg/device/ascend
// (device.go and device_test.go) and the chart's device ConfigMap (the 910A, 910B3, 310P and
// 910C entries); the generated differential against HAMi's own code is ascend_hami_test.
#include "tessera/device/ascend.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"

namespace tessera::device {
namespace {

using ::testing::HasSubstr;

AscendChipConfig Chip910A() {
  AscendChipConfig c;
  c.common_word = "Ascend910A";
  c.chip_name = "910A";
  c.resource_name = "huawei.com/Ascend910A";
  c.resource_memory_name = "huawei.com/Ascend910A-memory";
  c.resource_core_name = "huawei.com/Ascend910A-core";
  c.memory_allocatable = 32768;
  c.memory_capacity = 32768;
  c.memory_factor = 1;
  c.ai_core = 30;
  c.templates = {
      {"vir02", 2184, 2, 0}, {"vir04", 4369, 4, 0}, {"vir08", 8738, 8, 0}, {"vir16", 17476, 16, 0}};
  return c;
}

AscendChipConfig Chip310P() {
  AscendChipConfig c;
  c.common_word = "Ascend310P";
  c.resource_name = "huawei.com/Ascend310P";
  c.resource_memory_name = "huawei.com/Ascend310P-memory";
  c.resource_core_name = "huawei.com/Ascend310P-core";
  c.memory_allocatable = 21527;
  c.memory_capacity = 24576;
  c.templates = {{"vir01", 3072, 1, 1}, {"vir02", 6144, 2, 2}, {"vir04", 12288, 4, 4}};
  return c;
}

AscendChipConfig Chip910C() {
  AscendChipConfig c;
  c.common_word = "Ascend910C";
  c.resource_name = "huawei.com/Ascend910C";
  c.resource_memory_name = "huawei.com/Ascend910C-memory";
  c.resource_core_name = "huawei.com/Ascend910C-core";
  c.memory_allocatable = 65536;
  c.memory_capacity = 65536;
  c.super_pod = true;
  c.templates = {{"vir05_1c_16g", 16384, 5, 1}, {"vir10_3c_32g", 32768, 10, 3}};
  return c;
}

kube::Container C(kube::ResourceList limits, kube::ResourceList requests = {}) {
  kube::Container c;
  c.name = "main";
  c.limits = std::move(limits);
  c.requests = std::move(requests);
  return c;
}

TEST(AscendKeysTest, AreDerivedFromTheCommonWord) {
  AscendKeys k = AscendKeysOf("Ascend910B3");
  EXPECT_EQ(k.register_key, "hami.io/node-register-Ascend910B3");
  EXPECT_EQ(k.handshake_key, "hami.io/node-handshake-Ascend910B3");
  EXPECT_EQ(k.to_allocate, "hami.io/Ascend910B3-devices-to-allocate");
  EXPECT_EQ(k.allocated, "hami.io/Ascend910B3-devices-allocated");
  EXPECT_EQ(k.use_uuid, "hami.io/use-Ascend910B3-uuid");
  EXPECT_EQ(k.no_use_uuid, "hami.io/no-use-Ascend910B3-uuid");
  EXPECT_EQ(k.runtime_info, "huawei.com/Ascend910B3");
}

TEST(AscendTrimTest, RoundsUpToTheSmallestTemplateThenTheWholeCard) {
  const AscendChipConfig a = Chip910A();
  EXPECT_EQ(TrimAscendMemory(a, 0), (TrimmedMemory{2184, "vir02"}));
  EXPECT_EQ(TrimAscendMemory(a, 2184), (TrimmedMemory{2184, "vir02"}));
  EXPECT_EQ(TrimAscendMemory(a, 2185), (TrimmedMemory{4369, "vir04"}));
  EXPECT_EQ(TrimAscendMemory(a, 17476), (TrimmedMemory{17476, "vir16"}));
  EXPECT_EQ(TrimAscendMemory(a, 17477), (TrimmedMemory{32768, ""}));
  EXPECT_EQ(TrimAscendMemory(a, 32768), (TrimmedMemory{32768, ""}));
  EXPECT_EQ(TrimAscendMemory(a, 32769), (TrimmedMemory{0, ""}));
  // 310P: capacity above what a whole card offers.
  EXPECT_EQ(TrimAscendMemory(Chip310P(), 24576), (TrimmedMemory{21527, ""}));
  EXPECT_EQ(TrimAscendMemory(Chip310P(), -5), (TrimmedMemory{3072, "vir01"}));
}

TEST(AscendRequestTest, FollowsGenerateResourceRequests) {
  const AscendChipConfig a = Chip910A();
  auto one = [&](kube::ResourceList limits, kube::ResourceList requests = {}) {
    absl::StatusOr<std::optional<ContainerRequest>> r =
        DeriveAscendRequest(a, C(std::move(limits), std::move(requests)));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::nullopt;
  };
  EXPECT_EQ(one({}), std::nullopt);
  EXPECT_EQ(one({{"huawei.com/Ascend910A", "0"}}), std::nullopt);
  // Memory given: MiB; percentage unset. Without: the whole card.
  std::optional<ContainerRequest> r =
      one({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "8738"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->nums, 1);
  EXPECT_EQ(r->type, "Ascend910A");
  EXPECT_EQ(r->family, DeviceFamily::kAscend);
  EXPECT_EQ(r->memreq, 8738);
  EXPECT_EQ(r->mem_percentage, kPercentageUnset);
  EXPECT_EQ(r->coresreq, 0);
  r = one({{"huawei.com/Ascend910A", "2"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->memreq, 0);
  EXPECT_EQ(r->mem_percentage, 100);
  // Requests are read when limits lack the name; cores round up as Quantity.Value does.
  r = one({}, {{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-core", "1500m"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->coresreq, 2);
  // memoryFactor multiplies.
  AscendChipConfig f = a;
  f.memory_factor = 4;
  absl::StatusOr<std::optional<ContainerRequest>> scaled = DeriveAscendRequest(
      f, C({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "1000"}}));
  ASSERT_TRUE(scaled.ok() && scaled->has_value());
  EXPECT_EQ((*scaled)->memreq, 4000);
}

TEST(AscendRequestTest, MalformedValuesAreErrorsNamingTheResource) {
  const AscendChipConfig a = Chip910A();
  auto error = [&](kube::ResourceList limits, int32_t factor = 1) {
    AscendChipConfig chip = a;
    chip.memory_factor = factor;
    absl::StatusOr<std::optional<ContainerRequest>> r =
        DeriveAscendRequest(chip, C(std::move(limits)));
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : std::string(r.status().message());
  };
  EXPECT_EQ(error({{"huawei.com/Ascend910A", "-1"}}), "huawei.com/Ascend910A: \"-1\" is negative");
  EXPECT_EQ(error({{"huawei.com/Ascend910A", "1.5"}}),
            "huawei.com/Ascend910A: \"1.5\" is not an integer");
  EXPECT_EQ(error({{"huawei.com/Ascend910A", "3e9"}}),
            "huawei.com/Ascend910A: \"3e9\" is too large: the maximum is 2147483647");
  EXPECT_EQ(error({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "-1"}}),
            "huawei.com/Ascend910A-memory: \"-1\" is negative");
  EXPECT_THAT(error({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "16Gi"}}),
              HasSubstr("\"16Gi\" is too large: the maximum is 2147483647; the unit is MiB"));
  EXPECT_THAT(
      error({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "1073741824"}}, 2),
      HasSubstr("the maximum is 1073741823 (2147483647 / memoryFactor 2)"));
  EXPECT_EQ(error({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-core", "-2"}}),
            "huawei.com/Ascend910A-core: \"-2\" is negative");
}

TEST(AscendAdmitTest, RoundsMemoryToATemplateOutsideHamiCore) {
  absl::StatusOr<AscendAdmission> a = AdmitAscendContainer(
      Chip910A(), C({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "3000"}}),
      false);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->found);
  EXPECT_EQ(a->memory, 4369);
  EXPECT_EQ(a->count, std::nullopt);
  // No memory: the whole card is written.
  a = AdmitAscendContainer(Chip910A(), C({{"huawei.com/Ascend910A", "1"}}), false);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->memory, 32768);
  // hami-core keeps the asked memory.
  a = AdmitAscendContainer(
      Chip910A(), C({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "3000"}}),
      true);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->memory, 3000);
}

TEST(AscendAdmitTest, OnlyLimitsMakeAContainerOursAndOverwriteEnvMarksTheOthers) {
  AscendChipConfig chip = Chip910A();
  chip.overwrite_env = true;
  absl::StatusOr<AscendAdmission> a =
      AdmitAscendContainer(chip, C({}, {{"huawei.com/Ascend910A", "1"}}), false);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->found);
  EXPECT_TRUE(a->empty_visible_devices);
  a = AdmitAscendContainer(Chip910A(), C({}), false);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->empty_visible_devices);
}

TEST(AscendAdmitTest, RefusesWhatHamiRefusesWithItsWords) {
  auto refusal = [](const AscendChipConfig& chip, kube::ResourceList limits, bool hami_core,
                    kube::ResourceList requests = {}) {
    absl::StatusOr<AscendAdmission> a =
        AdmitAscendContainer(chip, C(std::move(limits), std::move(requests)), hami_core);
    EXPECT_FALSE(a.ok());
    return a.ok() ? std::string() : std::string(a.status().message());
  };
  EXPECT_EQ(
      refusal(Chip910A(),
              {{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "40000"}}, false),
      "huawei.com/Ascend910A-memory 40000 is invalid");
  EXPECT_EQ(
      refusal(Chip910A(),
              {{"huawei.com/Ascend910A", "2"}, {"huawei.com/Ascend910A-memory", "2000"}}, false),
      "vNPU not supported for multiple devices");
  EXPECT_EQ(refusal(Chip910A(), {{"huawei.com/Ascend910A", "1"}}, false,
                    {{"huawei.com/Ascend910A-core", "10"}}),
            "huawei.com/Ascend910A-core is only supported in hami-core (soft split) mode");
  EXPECT_EQ(refusal(Chip910C(), {{"huawei.com/Ascend910C", "3"}}, false),
            "Ascend910C device request must be 1 or 2*n, got 3");
  // Allowed: several whole cards; several soft-split cards; cores in hami-core mode; 0 cores.
  for (auto [limits, core] : std::vector<std::pair<kube::ResourceList, bool>>{
           {{{"huawei.com/Ascend910A", "2"}, {"huawei.com/Ascend910A-memory", "30000"}}, false},
           {{{"huawei.com/Ascend910A", "2"}, {"huawei.com/Ascend910A-memory", "2000"}}, true},
           {{{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-core", "50"}}, true},
           {{{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-core", "0"}}, false}}) {
    EXPECT_TRUE(AdmitAscendContainer(Chip910A(), C(limits), core).ok());
  }
}

TEST(AscendAdmitTest, A910CSuperPodRequestOfOneBecomesAPair) {
  absl::StatusOr<AscendAdmission> a =
      AdmitAscendContainer(Chip910C(), C({{"huawei.com/Ascend910C", "1"}}), false);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->count, 2);
  EXPECT_EQ(a->memory, 65536);
  a = AdmitAscendContainer(Chip910C(), C({{"huawei.com/Ascend910C", "4"}}), false);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->count, std::nullopt);
  // Without superPod, 910C requests are left alone.
  AscendChipConfig plain = Chip910C();
  plain.super_pod = false;
  EXPECT_TRUE(AdmitAscendContainer(plain, C({{"huawei.com/Ascend910C", "3"}}), false).ok());
}

TEST(AscendRuntimeInfoTest, IsHamisJsonWithTheTemplate) {
  // HAMi's Test_PatchAnnotations and Test_PatchAnnotations_VNPUCoreMode.
  PodDevices one = {{ContainerDevice{"device-0", "Ascend", 8738, 1}}};
  EXPECT_EQ(EncodeAscendRuntimeInfo(Chip910A(), one, false),
            R"([{"UUID":"device-0","temp":"vir08","memory":8738,"core":1}])");
  PodDevices soft = {{ContainerDevice{"ascend-uuid-1", "Ascend", 8192, 5}}};
  EXPECT_EQ(EncodeAscendRuntimeInfo(Chip910A(), soft, true),
            R"([{"UUID":"ascend-uuid-1","memory":8192,"core":5}])");
  // No core: omitted; a whole card: no template; several containers in order.
  PodDevices two = {{ContainerDevice{"a", "Ascend910A", 8738, 0}},
                    {},
                    {ContainerDevice{"b", "Ascend910A", 32768, 0}}};
  EXPECT_EQ(EncodeAscendRuntimeInfo(Chip910A(), two, false),
            R"([{"UUID":"a","temp":"vir08","memory":8738},{"UUID":"b","memory":32768}])");
  EXPECT_EQ(EncodeAscendRuntimeInfo(Chip910A(), PodDevices{{}}, false), "null");
}

kube::Node NodeWith(std::vector<std::pair<std::string, std::string>> annotations) {
  kube::Node n;
  n.meta.name = "npu-1";
  for (auto& [k, v] : annotations) {
    n.meta.annotations.Set(k, v);
  }
  return n;
}

TEST(AscendVendorTest, DecodesTheJsonRegistrationWithNetworkIds) {
  std::unique_ptr<Vendor> v = NewAscendVendor(Chip910A(), false);
  EXPECT_EQ(v->Key(), "Ascend910A");
  EXPECT_EQ(v->RegisterAnnotation(), "hami.io/node-register-Ascend910A");
  EXPECT_EQ(v->HandshakeAnnotation(), "hami.io/node-handshake-Ascend910A");
  EXPECT_EQ(v->ManagedResources(),
            (std::vector<std::string>{"huawei.com/Ascend910A", "huawei.com/Ascend910A-memory",
                                      "huawei.com/Ascend910A-core"}));
  // As the Ascend plugin writes it: index from 0, Type the common word, NetworkID by index.
  const std::string reg =
      R"([{"id":"npu-0","count":4,"devmem":32768,"devcore":30,"type":"Ascend910A","health":true,)"
      R"("custominfo":{"NetworkID":0}},{"id":"npu-5","index":5,"count":4,"devmem":32768,)"
      R"("devcore":30,"type":"Ascend910A","custominfo":{"NetworkID":1,"other":[1,{}]}},)"
      R"({"id":"npu-6","index":6,"type":"Ascend910A","custominfo":{"NetworkID":"x"}},)"
      R"({"id":"npu-7","index":7,"type":"Ascend910A","custominfo":null}])";
  absl::StatusOr<NodeDevices> n = v->DecodeNode(
      NodeWith({{"hami.io/node-register-Ascend910A", reg}, {"hami-vnpu-core", "true"}}));
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(n->devices.size(), 4U);
  EXPECT_TRUE(n->hami_core_allowed);
  EXPECT_EQ(n->devices[0].network_key, NetworkKey::kNumber);
  EXPECT_EQ(n->devices[0].network_id, 0);
  EXPECT_TRUE(n->devices[0].health);
  EXPECT_EQ(n->devices[1].network_id, 1);
  EXPECT_EQ(n->devices[1].index, 5);
  EXPECT_FALSE(n->devices[1].health);  // omitted: Go's zero value
  EXPECT_EQ(n->devices[2].network_key, NetworkKey::kOther);
  EXPECT_EQ(n->devices[3].network_key, NetworkKey::kNone);
  // The node's word, then the configured default.
  n = v->DecodeNode(NodeWith({{"hami.io/node-register-Ascend910A", reg}}));
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->hami_core_allowed);
  n = NewAscendVendor(Chip910A(), true)
          ->DecodeNode(
              NodeWith({{"hami.io/node-register-Ascend910A", reg}, {"hami-vnpu-core", "false"}}));
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->hami_core_allowed);
  // The encoder writes a NetworkID as the plugin does (one that is no number as null); every
  // device decodes back as it was read.
  EXPECT_EQ(DecodeNodeRegister(EncodeNodeRegisterJson(n->devices))->devices, n->devices);
}

TEST(AscendVendorTest, RefusesWhatIsNoAscendRegistration) {
  std::unique_ptr<Vendor> v = NewAscendVendor(Chip910A(), false);
  EXPECT_EQ(v->DecodeNode(NodeWith({})).status().code(), absl::StatusCode::kNotFound);
  for (const char* bad : {"GPU-1,10,32768,100,NVIDIA,0,true:", "[]", "[{\"id\":1}]",
                          R"([{"id":"a","custominfo":[1]}])"}) {
    absl::StatusOr<NodeDevices> n =
        v->DecodeNode(NodeWith({{"hami.io/node-register-Ascend910A", bad}}));
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(n.status().message(), HasSubstr("node npu-1: hami.io/node-register-Ascend910A"))
        << bad;
  }
}

TEST(AscendVendorTest, ConstraintsAreTheChipsSelectorsAndTheMode) {
  std::unique_ptr<Vendor> v = NewAscendVendor(Chip910A(), false);
  kube::Pod pod;
  pod.meta.ns = "default";
  pod.meta.name = "p";
  pod.meta.annotations.Set("hami.io/use-Ascend910A-uuid", " npu-0 , npu-1 ");
  pod.meta.annotations.Set("hami.io/no-use-Ascend910A-uuid", " , ");
  pod.meta.annotations.Set("nvidia.com/use-gpuuuid", "GPU-1");  // another vendor's selector
  pod.meta.annotations.Set(std::string(kVnpuModeAnnotation), "hami-core");
  pod.meta.annotations.Set(std::string(kGpuSchedulerPolicyAnnotation), "binpack,mutex");
  absl::StatusOr<PodConstraints> c = v->DecodeConstraints(pod);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->use_uuids, (std::vector<std::string>{"npu-0", "npu-1"}));
  EXPECT_EQ(c->nouse_uuids, (std::vector<std::string>{"", ""}));  // blank tokens match nothing
  EXPECT_EQ(c->vgpu_mode, "hami-core");
  ASSERT_TRUE(c->gpu_policy.has_value());
  EXPECT_EQ(c->gpu_policy->chain.size(), 2U);
  pod.meta.annotations.Set(std::string(kGpuSchedulerPolicyAnnotation), "fastest");
  EXPECT_THAT(v->DecodeConstraints(pod).status().message(),
              HasSubstr("pod default/p: hami.io/gpu-scheduler-policy"));
}

TEST(AscendVendorTest, AllocationsUseTheChipsAnnotationsInHamisFormat) {
  std::unique_ptr<Vendor> v = NewAscendVendor(Chip910A(), false);
  EXPECT_EQ(v->ToAllocateAnnotation(), "hami.io/Ascend910A-devices-to-allocate");
  EXPECT_EQ(v->AllocatedAnnotation(), "hami.io/Ascend910A-devices-allocated");
  PodDevices devices = {{}, {ContainerDevice{"npu-0", "Ascend910A", 8738, 0}}};
  const std::string encoded = v->EncodeAllocation(devices);
  EXPECT_EQ(encoded, ";npu-0,Ascend910A,8738,0:;");
  kube::Pod pod;
  pod.meta.ns = "default";
  pod.meta.name = "p";
  EXPECT_EQ(v->DecodeAllocation(pod).status().code(), absl::StatusCode::kNotFound);
  pod.meta.annotations.Set("hami.io/Ascend910A-devices-allocated", encoded);
  absl::StatusOr<PodDevices> back = v->DecodeAllocation(pod);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, devices);
}

TEST(AscendVendorTest, RequestsNameThePodAndContainer) {
  std::unique_ptr<Vendor> v = NewAscendVendor(Chip910A(), false);
  kube::Pod pod;
  pod.meta.ns = "default";
  pod.meta.name = "p";
  pod.init_containers = {C({})};
  pod.containers = {C({{"huawei.com/Ascend910A", "1"}}),
                    C({{"nvidia.com/gpu", "1"}})};  // another vendor's: not this chip's
  absl::StatusOr<PodRequest> r = v->DecodeRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->containers.size(), 3U);
  EXPECT_EQ(r->init_count, 1U);
  EXPECT_FALSE(r->containers[0].has_value());
  EXPECT_TRUE(r->containers[1].has_value());
  EXPECT_FALSE(r->containers[2].has_value());
  pod.containers[0] = C({{"huawei.com/Ascend910A", "x"}});
  EXPECT_THAT(v->DecodeRequest(pod).status().message(),
              HasSubstr("pod default/p: container \"main\": huawei.com/Ascend910A"));
}

}  // namespace
}  // namespace tessera::device

namespace tessera::device {
namespace {

TEST(AscendNetworkScoreTest, IsTheSameNetworkShareTimesTen) {
  NodeDevices node;
  for (int i = 0; i < 4; ++i) {
    DeviceInfo d;
    d.id = "npu-" + std::to_string(i);
    d.index = i;
    d.type = "Ascend910A";
    d.network_key = NetworkKey::kNumber;
    d.network_id = i / 2;
    node.devices.push_back(d);
  }
  auto dev = [](std::string id) { return ContainerDevice{std::move(id), "Ascend910A", 1000, 0}; };
  // Container 1: 2 of 3 on one network; container 2: 1 of 1.
  PodDevices pod = {{dev("npu-0"), dev("npu-1"), dev("npu-2")}, {}, {dev("npu-3")}};
  EXPECT_FLOAT_EQ(AscendNetworkScore("Ascend910A", pod, node),
                  (2.0F / 3.0F + 1.0F) * static_cast<float>(kAscend910NetworkWeight));
  // Other chips score nothing; so does a pod with a device without a NetworkID.
  EXPECT_EQ(AscendNetworkScore("Ascend310P", pod, node), 0);
  node.devices[3].network_key = NetworkKey::kNone;
  EXPECT_EQ(AscendNetworkScore("Ascend910A", pod, node), 0);
  // A NetworkID that is no number counts nowhere but does not zero the score.
  node.devices[3].network_key = NetworkKey::kOther;
  EXPECT_FLOAT_EQ(AscendNetworkScore("Ascend910A", pod, node),
                  2.0F / 3.0F * static_cast<float>(kAscend910NetworkWeight));
}

}  // namespace
}  // namespace tessera::device

namespace tessera::device {
namespace {

TEST(AscendPodAdmissionTest, RewritesTheResourcesAndSaysWhat) {
  AscendChipConfig chip = Chip910A();
  chip.runtime_class_name = "ascend";
  chip.overwrite_env = true;
  kube::Pod pod;
  kube::Container init = C({});
  init.name = "setup";
  pod.init_containers = {init};
  pod.containers = {C({{"huawei.com/Ascend910A", "1"}, {"huawei.com/Ascend910A-memory", "3000"}},
                      {{"huawei.com/Ascend910A-memory", "3000"}}),
                    C({{"huawei.com/Ascend910A", "1"}})};
  pod.containers[1].name = "whole";
  absl::StatusOr<AscendPodAdmission> a = AdmitAscendPod(chip, &pod);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->found);
  EXPECT_EQ(a->notes,
            (std::vector<std::string>{
                "container \"setup\": ASCEND_VISIBLE_DEVICES=\"\" added (overwriteEnv)",
                "container \"main\": huawei.com/Ascend910A-memory 3000 becomes 4369 (template "
                "vir04)",
                "container \"whole\": huawei.com/Ascend910A-memory set to 32768 (the whole card)",
                "runtimeClassName \"ascend\" unless the pod names one"}));
  EXPECT_EQ(pod.containers[0].limits.Get("huawei.com/Ascend910A-memory"), "4369");
  EXPECT_EQ(pod.containers[0].requests.Get("huawei.com/Ascend910A-memory"), "4369");
  EXPECT_EQ(pod.containers[1].limits.Get("huawei.com/Ascend910A-memory"), "32768");
  // Applied again, the webhook changes nothing.
  absl::StatusOr<AscendPodAdmission> again = AdmitAscendPod(chip, &pod);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->notes.size(), 2U);  // the env and runtime class notes only
}

TEST(AscendPodAdmissionTest, A910CPairAndARefusal) {
  kube::Pod pod;
  pod.containers = {C({{"huawei.com/Ascend910C", "1"}}, {{"huawei.com/Ascend910C", "1"}})};
  absl::StatusOr<AscendPodAdmission> a = AdmitAscendPod(Chip910C(), &pod);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(pod.containers[0].limits.Get("huawei.com/Ascend910C"), "2");
  EXPECT_EQ(pod.containers[0].requests.Get("huawei.com/Ascend910C"), "2");
  EXPECT_EQ(pod.containers[0].limits.Get("huawei.com/Ascend910C-memory"), "65536");
  EXPECT_EQ(a->notes.front(),
            "container \"main\": huawei.com/Ascend910C 1 becomes 2 (whole modules of two NPUs)");
  pod.containers = {C({{"huawei.com/Ascend910C", "3"}})};
  EXPECT_EQ(AdmitAscendPod(Chip910C(), &pod).status().message(),
            "Ascend910C device request must be 1 or 2*n, got 3");
}

}  // namespace
}  // namespace tessera::device
