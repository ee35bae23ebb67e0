// Tests of the MIG wire formats (mig.h) and of MIG-mode registrations (codec.h). Vectors quote
// HAMi v2.10.0's tests (pkg/device/nvidia/mig_profiles_test.go) and the worked A100-40GB example
// of the protocol reference; the comment above each names its source.
#include "tessera/device/mig.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/codec.h"

namespace tessera::device {
namespace {

MATCHER_P(ErrorContains, text, "") {
  return !arg.ok() && arg.status().code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.status().message()).find(text) != std::string::npos;
}

// Worked example (reference §2.4, key order of v2.10 pkg/device/devices.go:DeviceInfo and
// MigProfile): an A100-SXM4-40GB in mig mode at index 0, NUMA 0.
constexpr char kA100Register[] =
    R"([{"id":"GPU-5d1c7e2a-0000-4000-8000-000000000001","count":7,"devmem":40960,"devcore":100,)"
    R"("type":"NVIDIA A100-SXM4-40GB","mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":4864,)"
    R"("core":15,"sliceCount":1,"placements":[{"start":0,"size":1},{"start":1,"size":1},)"
    R"({"start":2,"size":1},{"start":3,"size":1},{"start":4,"size":1},{"start":5,"size":1},)"
    R"({"start":6,"size":1}]},{"name":"2g.10gb","memoryMB":9856,"core":29,"sliceCount":2,)"
    R"("placements":[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2}]},)"
    R"({"name":"3g.20gb","memoryMB":19968,"core":43,"sliceCount":3,"placements":[{"start":0,)"
    R"("size":4},{"start":4,"size":4}]},{"name":"7g.40gb","memoryMB":40192,"core":100,)"
    R"("sliceCount":7,"placements":[{"start":0,"size":8}]}],"health":true}])";

TEST(MigRegisterTest, DecodesTheV210ProfilesAndEncodesThemBackByteForByte) {
  absl::StatusOr<DecodedRegister> r = DecodeNodeRegister(kA100Register);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->devices.size(), 1U);
  const DeviceInfo& d = r->devices[0];
  EXPECT_EQ(d.mode, "mig");
  EXPECT_EQ(d.count, 7);
  ASSERT_EQ(d.mig_profiles.size(), 4U);
  EXPECT_EQ(d.mig_profiles[0].name, "1g.5gb");
  EXPECT_EQ(d.mig_profiles[0].memory_mb, 4864);
  EXPECT_EQ(d.mig_profiles[0].core, 15);
  EXPECT_EQ(d.mig_profiles[0].placements.size(), 7U);
  EXPECT_EQ(d.mig_profiles[2].placements[1], (MigPlacement{4, 4}));
  EXPECT_EQ(d.mig_profiles[3].slice_count, 7U);
  EXPECT_EQ(EncodeNodeRegisterJson(r->devices), kA100Register);
}

// v2.5.2's plugin registers a mig card with the delimited form: mode only, no geometry.
TEST(MigRegisterTest, DecodesTheV252DelimitedMigMode) {
  absl::StatusOr<DecodedRegister> r =
      DecodeNodeRegister("GPU-a,7,40960,100,NVIDIA A100-SXM4-40GB,0,true,0,mig:");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->format, RegisterFormat::kDelimited);
  EXPECT_EQ(r->devices[0].mode, "mig");
  EXPECT_TRUE(r->devices[0].mig_profiles.empty());
}

TEST(MigRegisterTest, GoDecodingRulesForProfiles) {
  // Case-insensitive keys, unknown keys ignored, null = zero, placements null = empty.
  absl::StatusOr<std::vector<MigProfile>> p = DecodeMigProfiles(
      R"([{"NAME":"1g.5gb","memorymb":5120,"core":null,"x":[1],"placements":null},null])");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 2U);
  EXPECT_EQ((*p)[0].name, "1g.5gb");
  EXPECT_EQ((*p)[0].memory_mb, 5120);
  EXPECT_TRUE((*p)[0].placements.empty());
  EXPECT_EQ((*p)[1], MigProfile{});
  std::string encoded;
  AppendMigProfilesJson(&encoded, {(*p)[0]});
  EXPECT_EQ(encoded,
            R"([{"name":"1g.5gb","memoryMB":5120,"core":0,"sliceCount":0,"placements":[]}])");
}

TEST(MigRegisterTest, BadProfilesAreErrorsNamingTheProfileAndField) {
  EXPECT_THAT(DecodeMigProfiles(R"([{"name":"1g"},{"core":"15"}])"),
              ErrorContains("migProfiles 1: field core: not an integer"));
  EXPECT_THAT(DecodeMigProfiles(R"([{"placements":[{"start":-1,"size":1}]}])"),
              ErrorContains("migProfiles 0: field placements 0.start: out of range: -1"));
  EXPECT_THAT(DecodeMigProfiles(R"([{"sliceCount":1.5}])"), ErrorContains("not an integer"));
  EXPECT_THAT(DecodeMigProfiles(R"({"name":"1g.5gb"})"), ErrorContains("not an array"));
  // In a registration the error names the device.
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"GPU-a","mode":"mig","migProfiles":[{"core":true}]}])"),
              ErrorContains("device 0: migProfiles 0: field core"));
}

// ---- hami.io/vgpu-mig-allocations -------------------------------------------------------------

// v2.10.0 TestEncodeDecodeMigAllocations, bytes as the worked example's filter patch.
TEST(MigAllocationsTest, EncodesTheSchedulerReservationAsHami) {
  MigAllocation a;
  a.gpu_uuid = "GPU-5d1c7e2a-0000-4000-8000-000000000001";
  a.profile = "1g.5gb";
  a.placement = {6, 1};
  const std::string encoded = EncodeMigAllocations({a});
  EXPECT_EQ(encoded,
            R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-5d1c7e2a-0000-4000-8000-)"
            R"(000000000001","profile":"1g.5gb","placement":{"start":6,"size":1}}])");
  absl::StatusOr<std::vector<MigAllocation>> back = DecodeMigAllocations(encoded);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::vector<MigAllocation>{a});
  EXPECT_FALSE((*back)[0].RuntimeReady());
  EXPECT_EQ(EncodeMigAllocations({}), "");
}

// Worked example (reference §2.4): the filter patch of a 4000 MiB pod that got 1g.5gb at
// start 6 — the device string carries the plain card UUID and the profile's NVML memory and
// core; the allocation names container 0, device 0.
TEST(MigAllocationsTest, WorkedExampleFilterPatchBytes) {
  constexpr char kGpu[] = "GPU-5d1c7e2a-0000-4000-8000-000000000001";
  const PodDevices devices = {{ContainerDevice{kGpu, "NVIDIA", 4864, 15}}};
  const PodMigReservations reservations = {{MigReservation{"1g.5gb", {6, 1}}}};
  EXPECT_EQ(EncodePodDevices(devices), std::string(kGpu) + ",NVIDIA,4864,15:;");
  EXPECT_EQ(EncodeMigAllocations(MigAllocationsOf(devices, reservations)),
            R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-5d1c7e2a-0000-4000-8000-)"
            R"(000000000001","profile":"1g.5gb","placement":{"start":6,"size":1}}])");
}

// HAMi counts positions over every device of every container (init first), MIG or not, and
// writes nothing for a pod without a reservation.
TEST(MigAllocationsTest, IndicesArePositionsInThePodDevices) {
  const PodDevices devices = {
      {},  // init, no GPU
      {ContainerDevice{"GPU-s", "NVIDIA", 1000, 10}, ContainerDevice{"GPU-m", "NVIDIA", 9856, 29},
       ContainerDevice{"GPU-m", "NVIDIA", 9856, 29}},
  };
  const PodMigReservations reservations = {
      {}, {std::nullopt, MigReservation{"2g.10gb", {0, 2}}, MigReservation{"2g.10gb", {2, 2}}}};
  const std::vector<MigAllocation> a = MigAllocationsOf(devices, reservations);
  ASSERT_EQ(a.size(), 2U);
  EXPECT_EQ(a[0].container_index, 1);
  EXPECT_EQ(a[0].device_index, 1);
  EXPECT_EQ(a[1].device_index, 2);
  EXPECT_EQ(a[1].placement, (MigPlacement{2, 2}));
  EXPECT_TRUE(DecodeMigAllocations(EncodeMigAllocations(a)).ok());
  EXPECT_EQ(EncodeMigAllocations(MigAllocationsOf(devices, {})), "");
  EXPECT_EQ(EncodeMigAllocations(MigAllocationsOf(devices, {{}, {MigReservation{"1g.5gb", {}}}})),
            "");  // size 0: HAMi skips it
}

// v2.10.0 TestDecodeMigAllocationsPreservesZeroRuntimeInstanceIDs.
TEST(MigAllocationsTest, KeepsAZeroRuntimeId) {
  constexpr char kRaw[] =
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",)"
      R"("placement":{"start":0,"size":2},"migUUID":"MIG-a","gpuInstanceID":4,)"
      R"("computeInstanceID":0}])";
  absl::StatusOr<std::vector<MigAllocation>> a = DecodeMigAllocations(kRaw);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 1U);
  EXPECT_EQ((*a)[0].gpu_instance_id, 4U);
  EXPECT_EQ((*a)[0].compute_instance_id, 0U);
  EXPECT_TRUE((*a)[0].RuntimeReady());
  EXPECT_EQ(EncodeMigAllocations(*a), kRaw);
}

TEST(MigAllocationsTest, EmptyIsNoAllocation) {
  absl::StatusOr<std::vector<MigAllocation>> a = DecodeMigAllocations("");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->empty());
}

// v2.10.0 TestDecodeMigAllocationsRejectsDuplicateDeviceIndex and ...PartialRuntimeIdentity,
// and the incomplete cases of DecodeMigAllocations.
TEST(MigAllocationsTest, RejectsWhatHamiRejects) {
  EXPECT_THAT(DecodeMigAllocations(
                  R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
                  R"("placement":{"start":6,"size":1}},{"containerIndex":0,"deviceIndex":0,)"
                  R"("gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":5,"size":1}}])"),
              ErrorContains("duplicate MIG allocation for container 0 device 0"));
  EXPECT_THAT(DecodeMigAllocations(
                  R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",)"
                  R"("placement":{"start":0,"size":2},"migUUID":"MIG-a"}])"),
              ErrorContains("MIG allocation 0 has partial runtime identity"));
  constexpr const char* kIncomplete[] = {
      R"([{"containerIndex":-1,"gpuUUID":"G","profile":"p","placement":{"size":1}}])",
      R"([{"deviceIndex":-1,"gpuUUID":"G","profile":"p","placement":{"size":1}}])",
      R"([{"profile":"p","placement":{"size":1}}])",
      R"([{"gpuUUID":"G","placement":{"size":1}}])",
      R"([{"gpuUUID":"G","profile":"p","placement":{"start":3}}])",
      R"([null])",
  };
  for (const char* raw : kIncomplete) {
    EXPECT_THAT(DecodeMigAllocations(raw), ErrorContains("MIG allocation 0 is incomplete")) << raw;
  }
  EXPECT_THAT(DecodeMigAllocations("[{"), ErrorContains("not JSON"));
  EXPECT_THAT(DecodeMigAllocations(R"({"a":1})"), ErrorContains("not an array"));
  EXPECT_THAT(DecodeMigAllocations(R"([{"gpuInstanceID":-4}])"),
              ErrorContains("MIG allocation 0: field gpuInstanceID: out of range: -4"));
}

// ---- Profile names ---------------------------------------------------------------------------

// v2.10.0 mig_profiles.go:ValidateMigProfileAllowlist.
TEST(MigProfileNameTest, FollowsHamisRule) {
  for (const char* good : {"1g.5gb", "7g.40gb", "xg.", "1g.10gb+me", "10g.x"}) {
    EXPECT_TRUE(ValidateMigProfileName(good).ok()) << good;
  }
  for (const char* bad : {"g.5gb", "1g5gb", "1x.5gb", "", ".1g"}) {
    EXPECT_THAT(
        ValidateMigProfileName(bad),
        ::testing::Property(&absl::Status::message, ::testing::HasSubstr("invalid MIG profile")))
        << bad;
  }
  EXPECT_EQ(MigProfileComputeSlices("3g.20gb"), 3U);
  EXPECT_EQ(MigProfileComputeSlices("1g.10gb+me"), 1U);
  EXPECT_EQ(MigProfileComputeSlices("xg.1"), 0U);
}

}  // namespace
}  // namespace tessera::device
