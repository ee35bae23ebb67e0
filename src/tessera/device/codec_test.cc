// Tests of the node registration and pod device codecs. Vectors quote HAMi's own test strings
// and docs where one exists; the comment above each names the version it follows.
#include "tessera/device/codec.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera::device {
namespace {

using ::testing::HasSubstr;

MATCHER_P(ErrorContains, text, "") {
  return !arg.ok() && arg.status().code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.status().message()).find(text) != std::string::npos;
}

DeviceInfo Dev(std::string id, int32_t index, int32_t count, int32_t devmem, int32_t devcore,
               std::string type, int32_t numa, std::string mode, bool health) {
  DeviceInfo d;
  d.id = std::move(id);
  d.index = index;
  d.count = count;
  d.devmem = devmem;
  d.devcore = devcore;
  d.type = std::move(type);
  d.numa = numa;
  d.mode = std::move(mode);
  d.health = health;
  return d;
}

constexpr char kP4[] = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4";

// ---- Delimited register ----------------------------------------------------------------------

// v2.5.2 pkg/util/util_test.go: the legacy 7-field form.
TEST(NodeRegisterDelimited, SevenFieldsGetIndexZeroAndHamiCore) {
  auto r = DecodeNodeRegister(std::string(kP4) + ",10,7680,100,NVIDIA-Tesla P4,0,true:");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->format, RegisterFormat::kDelimited);
  ASSERT_EQ(r->devices.size(), 1u);
  EXPECT_EQ(r->devices[0], Dev(kP4, 0, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", true));
}

// v2.5.2 pkg/util/util_test.go: the 9-field form with index 1.
TEST(NodeRegisterDelimited, NineFields) {
  auto r =
      DecodeNodeRegister(std::string(kP4) + ",10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->devices.size(), 1u);
  EXPECT_EQ(r->devices[0], Dev(kP4, 1, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", true));
}

// Project-HAMi/HAMi@v2.10.0 docs/develop/protocol.md: two V100s in the 7-field form.
TEST(NodeRegisterDelimited, TwoV100sFromHamiDocs) {
  auto r = DecodeNodeRegister(
      "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
      "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->devices.size(), 2u);
  EXPECT_EQ(r->devices[1].id, "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448");
  EXPECT_EQ(r->devices[1].devmem, 32768);
  EXPECT_EQ(r->devices[1].type, "NVIDIA-Tesla V100-PCIE-32GB");
}

TEST(NodeRegisterDelimited, MixedFieldCountsSkippedSegmentsAndGoBools) {
  // Segments without ',' (the empty tail, stray text) are skipped, as v2.5.2 does.
  auto r = DecodeNodeRegister(
      "GPU-a,4,1000,100,NVIDIA-T4,1,F:junk:GPU-b,2,2000,200,NVIDIA-T4,-1,1,3,mig::");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->devices.size(), 2u);
  EXPECT_EQ(r->devices[0], Dev("GPU-a", 0, 4, 1000, 100, "NVIDIA-T4", 1, "hami-core", false));
  EXPECT_EQ(r->devices[1], Dev("GPU-b", 3, 2, 2000, 200, "NVIDIA-T4", -1, "mig", true));
}

TEST(NodeRegisterDelimited, EmptyNinthFieldMeansHamiCore) {
  auto r = DecodeNodeRegister("GPU-a,4,1000,100,T,0,true,2,:");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices[0].mode, "hami-core");
}

// v2.10 strictness: number errors and negative indices are errors; the message names the
// device and field.
TEST(NodeRegisterDelimited, Errors) {
  EXPECT_THAT(DecodeNodeRegister(""), ErrorContains("neither a JSON array"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,0,true"), ErrorContains("neither a JSON array"));
  EXPECT_THAT(DecodeNodeRegister(":"), ErrorContains("node register: no device"));
  EXPECT_THAT(DecodeNodeRegister("junk:more:"), ErrorContains("node register: no device"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,0:"), ErrorContains("device 0: 6 comma fields"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,0,true,1:"),
              ErrorContains("device 0: 8 comma fields, want 7 or 9"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,0,true:GPU-b,1,2,3,T,0,true:GPU-c,1,x,3,T,0,true:"),
              ErrorContains("device 2: field devmem: not an integer: \"x\""));
  EXPECT_THAT(DecodeNodeRegister("GPU-a, 1,2,3,T,0,true:"),
              ErrorContains("device 0: field count: not an integer: \" 1\""));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3.5,T,0,true:"), ErrorContains("field devcore"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,zero,true:"), ErrorContains("field numa"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2147483648,3,T,0,true:"),
              ErrorContains("field devmem: not an integer"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,0,yes:"),
              ErrorContains("device 0: field health: not a boolean: \"yes\""));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,0,true,-1,mig:"),
              ErrorContains("device 0: field index: negative: -1"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,0,true,x,mig:"), ErrorContains("field index"));
  EXPECT_THAT(DecodeNodeRegister(",1,2,3,T,0,true:"), ErrorContains("device 0: field id: empty"));
  // Such an id would turn the re-encoded value into something that looks like JSON.
  EXPECT_THAT(DecodeNodeRegister("junk: [x,1,2,3,T,0,true:"),
              ErrorContains("device 0: field id: starts with '['"));
  EXPECT_THAT(DecodeNodeRegister("GPU-a,1,2,3,T,0,true:GPU-a,1,2,3,T,0,true:"),
              ErrorContains("device 1: field id: duplicate \"GPU-a\""));
}

TEST(NodeRegisterDelimited, EncodeAlwaysWritesNineFields) {
  std::vector<DeviceInfo> devices = {
      Dev(kP4, 0, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", true),
      Dev("GPU-b", 1, 7, 40960, 100, "NVIDIA A100-SXM4-40GB", 1, "mig", false)};
  std::string encoded = EncodeNodeRegisterDelimited(devices);
  EXPECT_EQ(encoded, std::string(kP4) +
                         ",10,7680,100,NVIDIA-Tesla P4,0,true,0,hami-core:"
                         "GPU-b,7,40960,100,NVIDIA A100-SXM4-40GB,1,false,1,mig:");
  auto r = DecodeNodeRegister(encoded);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->format, RegisterFormat::kDelimited);
  EXPECT_EQ(r->devices, devices);
  EXPECT_EQ(EncodeNodeRegisterDelimited({}), "");
}

// ---- JSON register ---------------------------------------------------------------------------

// HEAD pkg/scheduler/scheduler_test.go.
TEST(NodeRegisterJson, HamiSchedulerTestString) {
  auto r = DecodeNodeRegister(
      R"([{"id":"GPU-0","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100","numa":0,)"
      R"("health":true,"index":0,"mode":"hami-core"}])");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->format, RegisterFormat::kJson);
  ASSERT_EQ(r->devices.size(), 1u);
  EXPECT_EQ(r->devices[0], Dev("GPU-0", 0, 10, 8192, 100, "NVIDIA-A100", 0, "hami-core", true));
}

// HEAD pkg/device/nvidia/device_test.go: a MIG device with migProfiles, which Tessera ignores.
// The profiles are decoded (mig_test.cc has the details); keys the wire form lacks
// (instanceCount, multiprocessorCount) are ignored.
TEST(NodeRegisterJson, MigProfilesAreDecoded) {
  auto r = DecodeNodeRegister(
      R"([{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB",)"
      R"("numa":0,"health":true,"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":5120,)"
      R"("core":14,"sliceCount":1,"instanceCount":7,"multiprocessorCount":14,)"
      R"("placements":[{"start":6,"size":1}]}]}])");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->devices.size(), 1u);
  DeviceInfo want = Dev("GPU-0", 0, 7, 40960, 100, "NVIDIA-A100-SXM4-40GB", 0, "mig", true);
  want.mig_profiles = {MigProfile{"1g.5gb", 5120, 14, 1, {MigPlacement{6, 1}}}};
  EXPECT_EQ(r->devices[0], want);
}

// HEAD MarshalNodeDevices: omitempty drops zero index, numa, and health:false.
TEST(NodeRegisterJson, OmittedKeysTakeGoZeroValues) {
  auto r = DecodeNodeRegister(R"(  [{"id":"GPU-1","count":4,"type":"T"}, {"id":"GPU-2",)"
                              R"("index":null,"mode":"","health":false,"devicevendor":"NVIDIA"}])");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->devices.size(), 2u);
  // An omitted or empty mode is "hami-core" (the meaning of the 7-field delimited form).
  EXPECT_EQ(r->devices[0], Dev("GPU-1", 0, 4, 0, 0, "T", 0, "hami-core", false));
  EXPECT_EQ(r->devices[1], Dev("GPU-2", 0, 0, 0, 0, "", 0, "hami-core", false));
}

TEST(NodeRegisterJson, KeysMatchCaseInsensitivelyLikeGo) {
  auto r = DecodeNodeRegister(R"([{"ID":"GPU-1","Count":4,"HEALTH":true}])");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices[0].id, "GPU-1");
  EXPECT_EQ(r->devices[0].count, 4);
  EXPECT_TRUE(r->devices[0].health);
}

TEST(NodeRegisterJson, FormatDetectionSkipsJsonWhitespaceOnly) {
  auto r = DecodeNodeRegister(" \t\r\n[{\"id\":\"GPU-1\"}]\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->format, RegisterFormat::kJson);
  // Go would unmarshal `null` into an empty list; it is not an array, so it reads as a
  // (broken) delimited value here.
  EXPECT_THAT(DecodeNodeRegister("null"), ErrorContains("neither a JSON array"));
  EXPECT_THAT(DecodeNodeRegister("{\"id\":\"GPU-1\"}"), ErrorContains("node register: no device"));
  EXPECT_THAT(DecodeNodeRegister("   "), ErrorContains("neither a JSON array"));
}

// HAMi v2.10 pkg/device/nvidia/device.go, NvidiaGPUDevices.GetNodeDevices: a register value
// that unmarshals to zero devices returns the error "no gpu found on node", so the scheduler
// (pkg/scheduler/scheduler.go, getNodesUsage) fails the node with "node unregistered".
TEST(NodeRegisterJson, EmptyArrayIsAnError) {
  EXPECT_THAT(DecodeNodeRegister("[]"), ErrorContains("node register JSON: no device"));
  EXPECT_THAT(DecodeNodeRegister(" [ ]\n"), ErrorContains("node register JSON: no device"));
}

TEST(NodeRegisterJson, Errors) {
  EXPECT_THAT(DecodeNodeRegister("["), ErrorContains("node register JSON"));
  EXPECT_THAT(DecodeNodeRegister("[1]"), ErrorContains("device 0: not an object"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"GPU-0","count":"10"}])"),
              ErrorContains("device 0: field count: not a number"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"a"},{"id":"b","devmem":1.5}])"),
              ErrorContains("device 1: field devmem: not an integer"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"a","devmem":4294967296}])"),
              ErrorContains("device 0: field devmem: out of int32 range: 4294967296"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"a","index":-2}])"),
              ErrorContains("device 0: field index: negative: -2"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":7}])"), ErrorContains("field id: not a string"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"a","health":"true"}])"),
              ErrorContains("field health: not a boolean"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"count":1}])"), ErrorContains("device 0: field id: empty"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"a"},{"id":"a"}])"),
              ErrorContains("device 1: field id: duplicate"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"a"}] [])"), ErrorContains("trailing content"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"a"}] x)"), ErrorContains("node register JSON"));
  EXPECT_THAT(DecodeNodeRegister(R"([{"id":"a",}])"), ErrorContains("device 0"));
}

// The bytes Go's json.Marshal produces for HAMi's DeviceInfo (struct order, omitempty).
TEST(NodeRegisterJson, EncodeExactBytes) {
  std::vector<DeviceInfo> devices = {
      Dev("GPU-0", 0, 10, 8192, 100, "NVIDIA-A100", 0, "hami-core", true),
      Dev("GPU-1", 1, 10, 8192, 100, "NVIDIA-A100", 1, "mps", false)};
  EXPECT_EQ(EncodeNodeRegisterJson(devices),
            R"([{"id":"GPU-0","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100",)"
            R"("mode":"hami-core","health":true},{"id":"GPU-1","index":1,"count":10,)"
            R"("devmem":8192,"devcore":100,"type":"NVIDIA-A100","numa":1,"mode":"mps"}])");
  EXPECT_EQ(EncodeNodeRegisterJson({}), "[]");
  auto r = DecodeNodeRegister(EncodeNodeRegisterJson(devices));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices, devices);
}

// Go escapes <, >, & and U+2028/9, writes \b \f \n \r \t short, other controls as \u00xx,
// and replaces each invalid UTF-8 byte with \ufffd.
TEST(NodeRegisterJson, EncodeEscapesStringsLikeGo) {
  DeviceInfo d = Dev("GPU-\"q\"\\", 0, 1, 0, 0, "<a&b>\b\f\n\r\t\x01\x7f", 0, "m", false);
  d.type += "\xe2\x80\xa8\xe2\x80\xa9\xc3\xa9\xff\xe2\x80";
  EXPECT_EQ(EncodeNodeRegisterJson({d}),
            "[{\"id\":\"GPU-\\\"q\\\"\\\\\",\"count\":1,\"type\":\"\\u003ca\\u0026b\\u003e\\b\\f"
            "\\n\\r\\t\\u0001\x7f\\u2028\\u2029\xc3\xa9\\ufffd\\ufffd\\ufffd\",\"mode\":\"m\"}]");
  // nlohmann reads it back to the same text where the input was valid UTF-8.
  d.type = "<a&b>\b\f\n\r\t\x01\x7f\xe2\x80\xa8\xc3\xa9";
  nlohmann::json j = nlohmann::json::parse(EncodeNodeRegisterJson({d}));
  EXPECT_EQ(j[0]["id"], d.id);
  EXPECT_EQ(j[0]["type"], d.type);
  auto r = DecodeNodeRegister(EncodeNodeRegisterJson({d}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices[0], d);
}

// ---- Pod devices -----------------------------------------------------------------------------

constexpr char kA[] = "GPU-aaaaaaaa-0000-0000-0000-000000000001";
constexpr char kB[] = "GPU-bbbbbbbb-0000-0000-0000-000000000002";
constexpr char kC[] = "GPU-cccccccc-0000-0000-0000-000000000003";
constexpr char kD[] = "GPU-dddddddd-0000-0000-0000-000000000004";

ContainerDevice Cd(std::string uuid, int32_t mem, int32_t cores) {
  return ContainerDevice{std::move(uuid), "NVIDIA", mem, cores};
}

// docs/hami-device-plugin.md §2.5 case 1: [c0 (no GPU), c1 (1 GPU), c2 (2 GPUs)].
TEST(PodDevices, DevicePluginCase1ExactString) {
  PodDevices pod = {{}, {Cd(kA, 3000, 30)}, {Cd(kB, 4000, 50), Cd(kC, 4000, 50)}};
  const std::string want =
      ";GPU-aaaaaaaa-0000-0000-0000-000000000001,NVIDIA,3000,30:;"
      "GPU-bbbbbbbb-0000-0000-0000-000000000002,NVIDIA,4000,50:"
      "GPU-cccccccc-0000-0000-0000-000000000003,NVIDIA,4000,50:;";
  EXPECT_EQ(EncodePodDevices(pod), want);
  auto decoded = DecodePodDevices(want);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, pod);
}

// docs/hami-device-plugin.md §2.5 case 2: the same pod plus init container i0 (1 GPU, D).
TEST(PodDevices, DevicePluginCase2ExactString) {
  PodDevices pod = {
      {Cd(kD, 2000, 20)}, {}, {Cd(kA, 3000, 30)}, {Cd(kB, 4000, 50), Cd(kC, 4000, 50)}};
  const std::string want =
      "GPU-dddddddd-0000-0000-0000-000000000004,NVIDIA,2000,20:;;"
      "GPU-aaaaaaaa-0000-0000-0000-000000000001,NVIDIA,3000,30:;"
      "GPU-bbbbbbbb-0000-0000-0000-000000000002,NVIDIA,4000,50:"
      "GPU-cccccccc-0000-0000-0000-000000000003,NVIDIA,4000,50:;";
  EXPECT_EQ(EncodePodDevices(pod), want);
  auto decoded = DecodePodDevices(want);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, pod);
}

// docs/hami-protocol.md §2.2 (both versions): two containers, one GPU each; one container, 2 GPUs.
TEST(PodDevices, ProtocolExamples) {
  auto two = DecodePodDevices(
      "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;"
      "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,5000,0:;");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, (PodDevices{{Cd("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", 3000, 0)},
                              {Cd("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", 5000, 0)}}));
  auto one = DecodePodDevices("UUID1,NVIDIA,1000,30:UUID2,NVIDIA,1000,30:;");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, (PodDevices{{Cd("UUID1", 1000, 30), Cd("UUID2", 1000, 30)}}));
}

TEST(PodDevices, EncodeNeverWritesBlankPlaceholders) {
  PodDevices pod = {{Cd("", 0, 0)}, {Cd(kA, 1000, 30), ContainerDevice{}}, {}};
  EXPECT_EQ(EncodePodDevices(pod), std::string(";") + kA + ",NVIDIA,1000,30:;;");
  EXPECT_EQ(EncodePodDevices({}), "");
}

// v2.5.2 score_test.go "three containers, middle container uses one device": the v2.5.2
// scheduler wrote a blank placeholder, which holds nothing.
TEST(PodDevices, V252BlankPlaceholderIsDropped) {
  auto r = DecodePodDevices("uuid1,NVIDIA,1000,30:;;,,0,0:;");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (PodDevices{{Cd("uuid1", 1000, 30)}, {}, {}}));
}

// v2.5.2 schedulers wrote app containers only (no init entries, no entry for a leading
// device-less container); the decoder reads the entries as written.
TEST(PodDevices, V252CompactedString) {
  auto r = DecodePodDevices(std::string(kA) + ",NVIDIA,3000,30:;" + kB + ",NVIDIA,4000,50:" + kC +
                            ",NVIDIA,4000,50:;");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (PodDevices{{Cd(kA, 3000, 30)}, {Cd(kB, 4000, 50), Cd(kC, 4000, 50)}}));
}

// The plugin rewrites to-allocate as it consumes entries (G3 grows one ';' per call; G1/G2
// compacts). Every step decodes, with the consumed entries empty.
TEST(PodDevices, PluginRewrittenStrings) {
  auto g3 =
      DecodePodDevices(std::string(";;") + kB + ",NVIDIA,4000,50:" + kC + ",NVIDIA,4000,50:;;");
  ASSERT_TRUE(g3.ok()) << g3.status();
  EXPECT_EQ(*g3, (PodDevices{{}, {}, {Cd(kB, 4000, 50), Cd(kC, 4000, 50)}, {}}));
  auto done = DecodePodDevices(";;;;;");
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->size(), 5u);
  for (const auto& entry : *done) {
    EXPECT_TRUE(entry.empty());
  }
  auto g1_done = DecodePodDevices(";");
  ASSERT_TRUE(g1_done.ok());
  EXPECT_EQ(*g1_done, PodDevices{{}});
  auto empty = DecodePodDevices("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(PodDevices, Tolerance) {
  // No trailing ';' or ':'; pieces without ',' ignored; extra fields ignored.
  auto r = DecodePodDevices("GPU-a,NVIDIA,1,2,idx7:junk:;GPU-b,NVIDIA,+3,-0");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (PodDevices{{Cd("GPU-a", 1, 2)}, {Cd("GPU-b", 3, 0)}}));
}

// v2.5.2 MIG: "GPU-…[<template>-<slot>]"; the suffix is stripped so the device is booked on its
// physical GPU. Anything else in brackets is kept verbatim.
TEST(PodDevices, MigSuffixStripped) {
  auto r = DecodePodDevices(
      "GPU-936619fc-f6a1-74a8-0bc6-ecf6b3269313[7-9],NVIDIA,4864,0:GPU-x[a-1],NVIDIA,1,0:"
      "GPU-y[1-2][3-4],NVIDIA,1,0:;");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0][0].uuid, "GPU-936619fc-f6a1-74a8-0bc6-ecf6b3269313");
  EXPECT_EQ((*r)[0][1].uuid, "GPU-x[a-1]");
  EXPECT_EQ((*r)[0][2].uuid, "GPU-y[1-2][3-4]");
}

TEST(PodDevices, Errors) {
  EXPECT_THAT(DecodePodDevices("GPU-a,NVIDIA,1:;"),
              ErrorContains("container 0 device 0: 3 comma fields, want at least 4"));
  EXPECT_THAT(DecodePodDevices(";GPU-a,NVIDIA,1,1:GPU-b,NVIDIA,x,1:;"),
              ErrorContains("container 1 device 1: usedmem: not an integer: \"x\""));
  EXPECT_THAT(DecodePodDevices("GPU-a,NVIDIA,1,1.5:;"),
              ErrorContains("container 0 device 0: usedcores: not an integer: \"1.5\""));
  EXPECT_THAT(DecodePodDevices("GPU-a,NVIDIA,-5,1:;"),
              ErrorContains("container 0 device 0: usedmem: negative: -5"));
  EXPECT_THAT(DecodePodDevices("GPU-a,NVIDIA,5,-1:;"), ErrorContains("usedcores: negative: -1"));
  EXPECT_THAT(DecodePodDevices("GPU-a,NVIDIA,9999999999,1:;"), ErrorContains("usedmem"));
  EXPECT_THAT(DecodePodDevices(",NVIDIA,3000,30:;"),
              ErrorContains("container 0 device 0: empty UUID"));
}

// The names read back through the parsers; the defaults are what `tessera serve --help` shows.
TEST(PolicyNameTest, RoundTripsThroughTheParsers) {
  EXPECT_EQ(NodePolicyName(NodePolicy{}), "binpack");
  EXPECT_EQ(GpuPolicyName(GpuPolicy{}), "spread");
  for (NodePolicy p : {NodePolicy::kBinpack, NodePolicy::kSpread}) {
    EXPECT_EQ(*ParseNodePolicy(NodePolicyName(p)), p);
  }
  for (const char* chain : {"binpack", "spread,numa", "mutex", "numa,binpack"}) {
    absl::StatusOr<GpuPolicy> policy = ParseGpuPolicy(chain);
    ASSERT_TRUE(policy.ok()) << chain;
    EXPECT_EQ(GpuPolicyName(*policy), chain);
  }
}

}  // namespace
// Vectors of HAMi refs/pull/2731 pkg/util/numa_alignment_test.go:TestGetNumaAlignmentModeByPod
// (and ParseNumaAlignmentMode's message in pkg/util/numa_alignment.go).
TEST(NumaAlignmentTest, AcceptsBestEffortAndStrictCaseInsensitiveTrimmed) {
  EXPECT_EQ(*ParseNumaAlignment("best-effort"), NumaAlignment::kBestEffort);
  EXPECT_EQ(*ParseNumaAlignment(" best-effort "), NumaAlignment::kBestEffort);
  EXPECT_EQ(*ParseNumaAlignment("BEST-EFFORT"), NumaAlignment::kBestEffort);
  EXPECT_EQ(*ParseNumaAlignment("strict"), NumaAlignment::kStrict);
  EXPECT_EQ(*ParseNumaAlignment("Strict"), NumaAlignment::kStrict);
  EXPECT_EQ(*ParseNumaAlignment("\tstrict\n"), NumaAlignment::kStrict);
  // Go's strings.ToLower maps U+0130 to 'i'.
  EXPECT_EQ(*ParseNumaAlignment("STR\xc4\xb0"
                                "CT"),
            NumaAlignment::kStrict);
}

TEST(NumaAlignmentTest, RejectsEverythingElseWithHamisMessage) {
  for (const char* bad : {"", "required", "true", "best effort", "strict,best-effort", "none"}) {
    absl::StatusOr<NumaAlignment> got = ParseNumaAlignment(bad);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(ParseNumaAlignment("required").status().message(),
            "invalid hami.io/numa-alignment annotation \"required\": expected \"best-effort\" or "
            "\"strict\"");
  // The raw value is quoted, untrimmed.
  EXPECT_EQ(ParseNumaAlignment(" x ").status().message(),
            "invalid hami.io/numa-alignment annotation \" x \": expected \"best-effort\" or "
            "\"strict\"");
}

}  // namespace tessera::device
