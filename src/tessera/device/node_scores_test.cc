#include "tessera/device/node_scores.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/annotations.h"
#include "tessera/device/vendor.h"

namespace tessera::device {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

std::vector<DeviceInfo> Devices(std::vector<std::string> ids) {
  std::vector<DeviceInfo> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    DeviceInfo d;
    d.id = ids[i];
    d.index = static_cast<int32_t>(i);
    out.push_back(d);
  }
  return out;
}

std::vector<int64_t> Matrix(const std::vector<DeviceInfo>& devices, std::string_view value) {
  absl::StatusOr<std::vector<GpuPairScores>> s = DecodeNodeScores(value);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? PairScoreMatrix(devices, *s) : std::vector<int64_t>{};
}

TEST(NodeScoresTest, DecodesHamisTestVectors) {
  // HAMi v2.10 pkg/device/devices_test.go, TestDecodeNodeDevices (DecodePairScores).
  absl::StatusOr<std::vector<GpuPairScores>> one =
      DecodeNodeScores(R"([{"uuid":"GPU-0","score":{"GPU-1":50,"GPU-2":20,"GPU-3":20}}])");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].uuid, "GPU-0");
  EXPECT_THAT((*one)[0].scores,
              ElementsAre(Pair("GPU-1", 50), Pair("GPU-2", 20), Pair("GPU-3", 20)));
  // HAMi v2.10 pkg/device/nvidia/device_test.go, TestGetNodeDevices_PairScores (GetNodeDevices):
  // GPU-0's score towards GPU-1 is 100.
  const auto devices = Devices({"GPU-0", "GPU-1"});
  EXPECT_THAT(Matrix(devices, R"([{"uuid":"GPU-0","score":{"GPU-1":100}},)"
                              R"({"uuid":"GPU-1","score":{"GPU-0":100}}])"),
              ElementsAre(0, 100, 100, 0));
}

TEST(NodeScoresTest, EncodesAsHamisPluginWritesIt) {
  // docs/wire-formats.md's example (pkg/device-plugin/.../plugin/register.go marshals
  // []DevicePairScore): keys sorted, empty parts omitted, no whitespace.
  std::vector<GpuPairScores> scores = {
      {"GPU-a", {{"GPU-c", 60}, {"GPU-b", 450}}}, {"GPU-b", {{"GPU-a", 450}}}, {"", {}}};
  EXPECT_EQ(EncodeNodeScores(scores), R"([{"uuid":"GPU-a","score":{"GPU-b":450,"GPU-c":60}},)"
                                      R"({"uuid":"GPU-b","score":{"GPU-a":450}},{}])");
  EXPECT_EQ(EncodeNodeScores({}), "[]");
  // A repeated key keeps its last value, as a Go map would.
  EXPECT_EQ(EncodeNodeScores({{"a", {{"b", 1}, {"b", -2}}}}), R"([{"uuid":"a","score":{"b":-2}}])");
  absl::StatusOr<std::vector<GpuPairScores>> back = DecodeNodeScores(EncodeNodeScores(scores));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)[1], scores[1]);
}

TEST(NodeScoresTest, FollowsGoJsonDecoding) {
  const auto devices = Devices({"a", "b"});
  // Keys match case-insensitively; unknown keys are ignored; negative scores are kept.
  EXPECT_THAT(Matrix(devices, R"([{"UUID":"a","Score":{"b":-7},"extra":[1,{"x":null}]}])"),
              ElementsAre(0, -7, 0, 0));
  // The last "uuid" counts; a null uuid leaves the value so far; a second "score" adds keys.
  EXPECT_THAT(Matrix(devices, R"([{"uuid":"b","uuid":"a","uuid":null,"score":{"b":1},)"
                              R"("score":{"a":2}}])"),
              ElementsAre(2, 1, 0, 0));
  // A null score object empties the map; a null score is 0; a null element is empty.
  EXPECT_THAT(Matrix(devices, R"([null,{"uuid":"a","score":{"b":5},"score":null},)"
                              R"({"uuid":"b","score":{"a":null}}])"),
              IsEmpty());
  // A whole null value: no scores (Go leaves the slice nil).
  absl::StatusOr<std::vector<GpuPairScores>> none = DecodeNodeScores(" null ");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_THAT(*none, IsEmpty());
  // int64 bounds are integers.
  EXPECT_THAT(Matrix(devices, R"([{"uuid":"a","score":{"b":-9223372036854775808,"a":-0}}])"),
              ElementsAre(0, INT64_MIN, 0, 0));
}

TEST(NodeScoresTest, MatrixFollowsHamisLookup) {
  const auto devices = Devices({"a", "b", "c"});
  // The first element for a device counts (GetNodeDevices breaks at the first match); elements
  // and keys naming no registered device are ignored; a repeated key keeps the last value.
  EXPECT_THAT(Matrix(devices, R"([{"uuid":"zz","score":{"a":9}},)"
                              R"({"uuid":"a","score":{"b":1,"zz":9,"c":3,"c":4}},)"
                              R"({"uuid":"a","score":{"b":100}}])"),
              ElementsAre(0, 1, 4, 0, 0, 0, 0, 0, 0));
  // All zeros, or no element for any device: no matrix at all (no memory for such nodes).
  EXPECT_THAT(Matrix(devices, R"([{"uuid":"a","score":{"b":0}}])"), IsEmpty());
  EXPECT_THAT(Matrix(devices, "[]"), IsEmpty());
  // Above kMaxScoredDevices devices the scores are ignored (the matrix would be n²).
  std::vector<std::string> ids;
  for (size_t i = 0; i <= kMaxScoredDevices; ++i) {
    ids.push_back("GPU-" + std::to_string(i));
  }
  const std::string one = R"([{"uuid":"GPU-0","score":{"GPU-1":5}}])";
  EXPECT_THAT(Matrix(Devices(ids), one), IsEmpty());
  ids.pop_back();
  EXPECT_EQ(Matrix(Devices(ids), one).size(), kMaxScoredDevices * kMaxScoredDevices);
}

TEST(NodeScoresTest, RejectsWhatGoRejects) {
  // HAMi v2.10 pkg/device/nvidia/device_test.go, TestGetNodeDevices_InvalidPairScores.
  for (std::string_view bad : {
           "not-valid-json",
           "",
           R"({"uuid":"a"})",
           R"([{"uuid":"a","score":{"b":1.5}}])",
           R"([{"uuid":"a","score":{"b":1e2}}])",
           R"([{"uuid":"a","score":{"b":9223372036854775808}}])",
           R"([{"uuid":"a","score":{"b":"1"}}])",
           R"([{"uuid":7}])",
           R"([{"uuid":"a","score":[]}])",
           R"([1])",
           R"([{"uuid":"a"}] x)",
           R"([{"uuid":"a","x":tru}])",
       }) {
    absl::StatusOr<std::vector<GpuPairScores>> s = DecodeNodeScores(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr("node scores")) << bad;
  }
  EXPECT_THAT(
      DecodeNodeScores(R"([{"uuid":"a"},{"uuid":"b","score":{"c":1.5}}])").status().message(),
      HasSubstr("entry 1: score \"c\": not an integer"));
}

kube::Node NodeWith(std::string_view scores) {
  kube::Node node;
  node.meta.name = "n1";
  node.meta.annotations.Set(
      std::string(kNodeRegisterAnnotation),
      R"([{"id":"GPU-0","count":1,"devmem":8192,"devcore":100,"type":"NVIDIA-V100","health":true},)"
      R"({"id":"GPU-1","index":1,"count":1,"devmem":8192,"devcore":100,"type":"NVIDIA-V100","health":true}])");
  if (!scores.empty()) {
    node.meta.annotations.Set(std::string(kNodeScoreAnnotation), std::string(scores));
  }
  return node;
}

TEST(NodeScoresTest, TheVendorCarriesScoresAndFailsTheNodeOnBadOnes) {
  std::unique_ptr<Vendor> v = NewNvidiaVendor(DefaultNvidiaConfig());
  // Missing: all zeros (no matrix).
  absl::StatusOr<NodeDevices> plain = v->DecodeNode(NodeWith(""));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(plain->pair_scores, IsEmpty());
  EXPECT_EQ(plain->PairScore(0, 1), 0);
  absl::StatusOr<NodeDevices> scored =
      v->DecodeNode(NodeWith(R"([{"uuid":"GPU-1","score":{"GPU-0":450}}])"));
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_EQ(scored->PairScore(1, 0), 450);
  EXPECT_EQ(scored->PairScore(0, 1), 0);
  // Unparsable: the node's NVIDIA registration fails (HAMi's GetNodeDevices returns the error).
  absl::StatusOr<NodeDevices> bad = v->DecodeNode(NodeWith("not-valid-json"));
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("node n1: hami.io/node-nvidia-score"));
}

TEST(NodeScoresTest, SortByIndexPermutesTheMatrix) {
  NodeDevices node;
  node.devices = Devices({"a", "b"});
  node.devices[0].index = 5;        // "a" sorts after "b"
  node.pair_scores = {0, 7, 3, 0};  // a->b 7, b->a 3
  node.SortByIndex();
  ASSERT_EQ(node.devices[0].id, "b");
  EXPECT_EQ(node.PairScore(0, 1), 3);  // b->a
  EXPECT_EQ(node.PairScore(1, 0), 7);  // a->b
}

}  // namespace
}  // namespace tessera::device
