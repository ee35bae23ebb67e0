// The NUMA refit's wire format and text rules (refit.h), with vectors from HAMi refs/pull/2731.
#include "tessera/extender/refit.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

device::ContainerDevice Dev(const std::string& uuid, int32_t mem, int32_t cores) {
  return device::ContainerDevice{uuid, "NVIDIA", mem, cores};
}

// HAMi pkg/device/numa_refit.go:NumaRefitRequest, the plugin's marshalled form
// (plugin/numa_refit_client.go).
constexpr char kHamiRequest[] =
    R"({"podUID":"u1","podNamespace":"ml","podName":"p","nodeName":"n1","containerIndex":1,)"
    R"("containerName":"main","deviceType":"NVIDIA","allowedDeviceUUIDs":["GPU-b","GPU-c"]})";

TEST(RefitWireTest, DecodesHamisRequestAndEncodesItBackByteForByte) {
  absl::StatusOr<RefitRequest> req = DecodeRefitRequest(kHamiRequest);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->pod_uid, "u1");
  EXPECT_EQ(req->pod_namespace, "ml");
  EXPECT_EQ(req->pod_name, "p");
  EXPECT_EQ(req->node_name, "n1");
  EXPECT_EQ(req->container_index, 1);
  EXPECT_EQ(req->container_name, "main");
  EXPECT_EQ(req->device_type, "NVIDIA");
  EXPECT_THAT(req->allowed_device_uuids, ElementsAre("GPU-b", "GPU-c"));
  EXPECT_EQ(EncodeRefitRequest(*req), kHamiRequest);
}

TEST(RefitWireTest, ReadsKeysAsGoDoes) {
  // Case-insensitive keys, unknown keys ignored, null as the zero value, containerName omitted.
  absl::StatusOr<RefitRequest> req =
      DecodeRefitRequest(R"( {"poduid":"u","PODNAMESPACE":"ns","podName":null,"extra":{"x":[1]},)"
                         R"("containerIndex":null,"allowedDeviceUUIDs":null} )");
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->pod_uid, "u");
  EXPECT_EQ(req->pod_namespace, "ns");
  EXPECT_EQ(req->pod_name, "");
  EXPECT_EQ(req->container_index, 0);
  EXPECT_TRUE(req->allowed_device_uuids.empty());
  EXPECT_THAT(EncodeRefitRequest(*req), HasSubstr(R"("containerIndex":0,"deviceType":"")"));
  // A key repeated (exactly or in another case) is read each time: the last one wins. Keys of
  // nested objects are not the request's.
  req = DecodeRefitRequest(
      R"({"podUID":"a","x":{"podUID":"nested","y":[{"podName":"n"}]},"PodUid":"b",)"
      R"("allowedDeviceUUIDs":["GPU-a"],"podName":"p","allowedDeviceUUIDs":["GPU-b","GPU-c"]})");
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->pod_uid, "b");
  EXPECT_EQ(req->pod_name, "p");
  EXPECT_THAT(req->allowed_device_uuids, ElementsAre("GPU-b", "GPU-c"));
}

TEST(RefitWireTest, RefusesWhatIsNotARequestNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "not a JSON document"},
      {"[]", "expected a JSON object"},
      {R"({"podUID":1})", "podUID: expected a string"},
      {R"({"containerIndex":"1"})", "containerIndex: expected a number"},
      {R"({"containerIndex":1.5})", "containerIndex: expected an integer"},
      {R"({"containerIndex":18446744073709551615})", "containerIndex: out of range"},
      {R"({"allowedDeviceUUIDs":"GPU-a"})", "allowedDeviceUUIDs: expected an array of strings"},
      {R"({"allowedDeviceUUIDs":["GPU-a",2]})", "allowedDeviceUUIDs[1]: expected a string"},
      {R"({"podUID":"u"} {"podUID":"v"})", "not a JSON document"},
      {R"({"podUID":"u"}x)", "not a JSON document"},
      // Values of the wrong kind at any depth; a syntax error anywhere outranks a field error.
      {R"({"podUID":{"a":1}})", "podUID: expected a string"},
      {R"({"containerIndex":[1]})", "containerIndex: expected a number"},
      {R"({"allowedDeviceUUIDs":["GPU-a",["GPU-b"]]})", "allowedDeviceUUIDs[1]: expected a string"},
      {R"({"allowedDeviceUUIDs":{"0":"GPU-a"}})", "expected an array of strings"},
      {R"({"podUID":1,"x":]})", "not a JSON document"},
  };
  for (const auto& [body, message] : cases) {
    SCOPED_TRACE(body);
    absl::StatusOr<RefitRequest> req = DecodeRefitRequest(body);
    ASSERT_FALSE(req.ok());
    EXPECT_EQ(req.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(req.status().message(), HasSubstr(message));
  }
  // Deep nesting is refused before any recursive parse.
  std::string deep = R"({"x":)" + std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_THAT(DecodeRefitRequest(deep).status().message(), HasSubstr("nests deeper than 64"));
}

// /refit is unauthenticated: a body of 80,000 keys (case variants of the fields, each decoded,
// and unknown ones) must cost work linear in its size. Held structurally, not by a clock: each
// key is compared with the field names only, and no key is kept to search later ones against.
TEST(RefitWireTest, DecodingIsLinearInTheNumberOfKeys) {
  constexpr size_t kKeys = 80000;
  std::string body = "{";
  for (size_t i = 0; i < kKeys; ++i) {
    if (i > 0) {
      body += ',';
    }
    if (i % 2 == 0) {
      // A distinct case variant of podUID for each i < 64; then repeats.
      std::string key = "poduid";
      for (size_t b = 0; b < key.size(); ++b) {
        if ((i / 2 >> b) & 1) {
          key[b] = static_cast<char>(key[b] - 'a' + 'A');
        }
      }
      body += "\"" + key + "\":\"u" + std::to_string(i) + "\"";
    } else {
      body += "\"x" + std::to_string(i) + "\":[" + std::to_string(i) + "]";
    }
  }
  body += "}";
  RefitDecodeStats stats;
  absl::StatusOr<RefitRequest> req = DecodeRefitRequest(body, &stats);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->pod_uid, "u" + std::to_string(kKeys - 2));  // the last one wins, as in Go
  EXPECT_EQ(stats.keys, kKeys);
  EXPECT_LE(stats.key_comparisons, kRefitFields * kKeys);
  EXPECT_EQ(stats.max_keys_held, 0u);
}

TEST(RefitWireTest, EncodesResponsesAsGoMarshalsThem) {
  // HAMi pkg/device/numa_refit.go:NumaRefitResponse (omitempty on both strings).
  EXPECT_EQ(EncodeRefitResponse({true, "GPU-b,NVIDIA,3000,30:", ""}),
            R"({"succeeded":true,"containerDevices":"GPU-b,NVIDIA,3000,30:"})");
  EXPECT_EQ(
      EncodeRefitResponse({false, "", "no allowed device fits: 1/1 CardInsufficientMemory"}),
      R"({"succeeded":false,"failureReason":"no allowed device fits: 1/1 CardInsufficientMemory"})");
  EXPECT_EQ(EncodeRefitResponse({false, "", ""}), R"({"succeeded":false})");
  // Go's HTML escaping.
  EXPECT_EQ(EncodeRefitResponse({false, "", "<&>"}),
            R"({"succeeded":false,"failureReason":"\u003c\u0026\u003e"})");
}

TEST(RefitTextTest, EncodesContainerDevicesAndIdLists) {
  // HAMi pkg/device/devices.go:EncodeContainerDevices: each device followed by ':'.
  EXPECT_EQ(EncodeContainerDevices({Dev("GPU-b", 3000, 30)}), "GPU-b,NVIDIA,3000,30:");
  EXPECT_EQ(EncodeContainerDevices({Dev("GPU-b", 3000, 30), Dev("GPU-c", 3000, 30)}),
            "GPU-b,NVIDIA,3000,30:GPU-c,NVIDIA,3000,30:");
  EXPECT_EQ(DeviceIdList({Dev("GPU-a", 1, 1), Dev("GPU-b", 1, 1)}), "[GPU-a GPU-b]");
  EXPECT_EQ(DeviceIdList({}), "[]");
}

// HAMi refs/pull/2731 pkg/scheduler/numa_refit_handler.go:replaceContainerDeviceEntry.
TEST(RefitTextTest, ReplacesOnlyThatContainersSegment) {
  const device::ContainerDevices to = {Dev("GPU-b", 3000, 30)};
  // Blank (consumed) entries and the separators survive byte for byte.
  EXPECT_EQ(*ReplaceContainerEntry(";GPU-a,NVIDIA,3000,30:;GPU-x,NVIDIA,1,2:;", 1, to),
            ";GPU-b,NVIDIA,3000,30:;GPU-x,NVIDIA,1,2:;");
  EXPECT_EQ(*ReplaceContainerEntry("GPU-a,NVIDIA,3000,30:", 0, to), "GPU-b,NVIDIA,3000,30:");
  EXPECT_EQ(*ReplaceContainerEntry("GPU-a,NVIDIA,3000,30:;;", 0, to), "GPU-b,NVIDIA,3000,30:;;");
  // Odd but kept bytes (spaces, trailing text) outside the segment stay.
  EXPECT_EQ(*ReplaceContainerEntry("X ;GPU-a,NVIDIA,3000,30:; tail", 1, to),
            "X ;GPU-b,NVIDIA,3000,30:; tail");
  for (int64_t index : std::vector<int64_t>{-1, 1, 2, 5, int64_t{1} << 40}) {
    SCOPED_TRACE(index);
    absl::StatusOr<std::string> r = ReplaceContainerEntry("GPU-a,NVIDIA,3000,30:;;", index, to);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(),
              "annotation has no container entry at index " + std::to_string(index));
  }
  EXPECT_FALSE(ReplaceContainerEntry("", 0, to).ok());
}

}  // namespace
}  // namespace tessera::extender
