#include "tessera/explain/top.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::explain {
namespace {

using ::testing::ContainsRegex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The shape serve/debug_json.h renders for /debug/ledger (fields top does not read omitted).
constexpr char kLedger[] = R"({
  "synced": true,
  "leadership": {"role": "leader"},
  "records": 3,
  "nodes": [
    {"name": "gpu-b", "availability": "available", "detail": "", "devices": [
      {"uuid": "GPU-b0", "index": 0, "type": "NVIDIA-A100", "health": true, "cordoned": false,
       "count": 10, "devmem_mib": 40960, "devcore": 100, "used": 2, "usedmem_mib": 24000,
       "usedcores": 30, "pods": [
         {"namespace": "ml", "name": "train-7", "uid": "u1", "container": 0, "init": false,
          "usedmem_mib": 20000, "usedcores": 30, "reserved": false},
         {"namespace": "web", "name": "infer-2", "uid": "u2", "container": 1, "init": false,
          "usedmem_mib": 4000, "usedcores": 0, "reserved": true}]},
      {"uuid": "GPU-b1", "index": 1, "type": "NVIDIA-A100", "health": false, "cordoned": false,
       "count": 10, "devmem_mib": 40960, "devcore": 100, "used": 0, "usedmem_mib": 0,
       "usedcores": 0, "pods": []}]},
    {"name": "gpu-a", "devices": [
      {"uuid": "GPU-a0", "index": 0, "type": "NVIDIA-T4", "health": true, "cordoned": false,
       "count": 10, "devmem_mib": 16384, "devcore": 100, "used": 1, "usedmem_mib": 1000,
       "usedcores": 0, "pods": [
         {"namespace": "ml", "name": "setup", "uid": "u3", "container": 0, "init": true,
          "usedmem_mib": 1000, "usedcores": 0, "reserved": false}]}]}],
  "reservations": [{"namespace": "web", "name": "infer-2", "uid": "u2", "node": "gpu-b",
                    "expires_at": "2026-12-05T10:03:12Z"}],
  "problems": {"conflicts": [], "orphans": [{"namespace": "ml", "name": "old", "uid": "u9",
               "node": "gpu-c", "uuid": "GPU-gone", "container": 0, "reserved": false}],
               "unregistered": [], "unreadable": [{"namespace": "web", "name": "bad", "uid": "u8",
               "node": "gpu-a"}]}
})";

TopOptions Only(std::string node, std::string ns, int64_t min_free = 0,
                TopSort sort = TopSort::kNode) {
  TopOptions o;
  o.node = std::move(node);
  o.ns = std::move(ns);
  o.min_free = min_free;
  o.sort = sort;
  return o;
}

const absl::Time kNow = absl::FromUnixSeconds(1796464800);  // 2026-12-05T10:00:00Z

TopView Decoded() {
  absl::StatusOr<TopView> view = DecodeTop(kLedger);
  EXPECT_TRUE(view.ok()) << view.status();
  return view.ok() ? *view : TopView{};
}

TEST(TopTest, TheTableShowsDevicesTheirPodsReservationsAndProblems) {
  const std::string text = RenderTopText(Decoded(), kNow);
  EXPECT_THAT(text, HasSubstr("gpu-b"));
  // Usage, free memory, cores and shares of GPU-b0; its two pods, one reserved with 3m12s left.
  EXPECT_THAT(text, HasSubstr("GPU-b0 (0)"));
  EXPECT_THAT(text,
              ContainsRegex(R"(GPU-b0 \(0\) +NVIDIA-A100 +24000/40960 +16960 +30/100 +2/10\s)"));
  EXPECT_THAT(text, HasSubstr("ml/train-7 [0]"));
  EXPECT_THAT(text, ContainsRegex(R"(ml/train-7 \[0\] +20000 +30 +bound)"));
  EXPECT_THAT(text, HasSubstr("web/infer-2 [1]"));
  EXPECT_THAT(text, HasSubstr("reserved, expires in 3m12s"));
  EXPECT_THAT(text, HasSubstr("ml/setup [init 0]"));
  EXPECT_THAT(text, Not(HasSubstr("available")));  // a node's state only when it is not
  EXPECT_THAT(text, HasSubstr("unhealthy"));
  EXPECT_THAT(text, HasSubstr("orphan: ml/old holds GPU-gone, which gpu-c does not register"));
  EXPECT_THAT(text, HasSubstr("unreadable: web/bad on gpu-a"));
}

TEST(TopTest, FiltersByNodeNamespaceAndFreeMemory) {
  TopView v = FilterTop(Decoded(), Only("gpu-a", ""));
  ASSERT_EQ(v.nodes.size(), 1u);
  EXPECT_EQ(v.nodes[0].name, "gpu-a");

  v = FilterTop(Decoded(), Only("", "web"));
  ASSERT_EQ(v.nodes.size(), 1u);  // gpu-a holds no web pod
  ASSERT_EQ(v.nodes[0].devices.size(), 1u);
  EXPECT_EQ(v.nodes[0].devices[0].uuid, "GPU-b0");
  ASSERT_EQ(v.nodes[0].devices[0].pods.size(), 1u);
  EXPECT_EQ(v.nodes[0].devices[0].pods[0].name, "infer-2");
  EXPECT_THAT(v.problems, ElementsAre(HasSubstr("web/bad")));

  v = FilterTop(Decoded(), Only("", "", 15000));
  std::vector<std::string> uuids;
  for (const TopNode& n : v.nodes) {
    for (const TopDevice& d : n.devices) {
      uuids.push_back(d.uuid);
    }
  }
  EXPECT_THAT(uuids, ElementsAre("GPU-b0", "GPU-b1", "GPU-a0"));
  v = FilterTop(Decoded(), Only("", "", 16961));
  ASSERT_EQ(v.nodes.size(), 1u);
  EXPECT_EQ(v.nodes[0].devices.size(), 1u);  // GPU-b1 only (unhealthy, but 40960 free)
}

TEST(TopTest, SortByFreeMemoryPutsTheEmptiestFirst) {
  // gpu-b's healthy free memory: 16960 (GPU-b1 is unhealthy); gpu-a's: 15384.
  TopView v = FilterTop(Decoded(), Only("", "", 0, TopSort::kFree));
  ASSERT_EQ(v.nodes.size(), 2u);
  EXPECT_EQ(v.nodes[0].name, "gpu-b");
  EXPECT_EQ(v.nodes[0].devices[0].uuid, "GPU-b1");  // devices by their own free memory
  v = FilterTop(Decoded(), Only("", "", 0, TopSort::kNode));
  EXPECT_EQ(v.nodes[0].name, "gpu-b");  // the document's order (serve's, by name) is kept
}

TEST(TopTest, JsonCarriesStatesExpiriesAndFreeMemory) {
  const nlohmann::json j = TopJson(Decoded());
  EXPECT_EQ(j["role"], "leader");
  const nlohmann::json& b0 = j["nodes"][0]["devices"][0];
  EXPECT_EQ(b0["freemem_mib"], 16960);
  EXPECT_EQ(b0["pods"][1]["state"], "reserved");
  EXPECT_EQ(b0["pods"][1]["expires_at"], "2026-12-05T10:03:12Z");
  EXPECT_FALSE(b0["pods"][0].contains("expires_at"));
  EXPECT_EQ(j["problems"].size(), 2u);
}

TEST(TopTest, AnUnsyncedLedgerIsSaid) {
  std::string doc = kLedger;
  doc.replace(doc.find("\"synced\": true"), 14, "\"synced\": false");
  absl::StatusOr<TopView> v = DecodeTop(doc);
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(RenderTopText(*v, kNow), HasSubstr("has not synced"));
  EXPECT_THAT(RenderTopText(Decoded(), kNow), Not(HasSubstr("has not synced")));
}

TEST(TopTest, BadDocumentsNameTheField) {
  auto error = [](std::string doc) {
    absl::StatusOr<TopView> v = DecodeTop(doc);
    EXPECT_FALSE(v.ok());
    return std::string(v.status().message());
  };
  EXPECT_THAT(error("not json"), HasSubstr("expected a JSON object"));
  EXPECT_THAT(error("[]"), HasSubstr("expected a JSON object"));
  EXPECT_EQ(error(R"({"synced":true})"), "leadership: missing");
  std::string doc = kLedger;
  doc.replace(doc.find("\"devmem_mib\": 16384"), 19, "\"devmem_mib\": \"16384\"");
  EXPECT_EQ(error(doc), "nodes[1].devices[0].devmem_mib: expected an integer");
  doc = kLedger;
  doc.replace(doc.find("2026-12-05T10:03:12Z"), 20, "tomorrow");
  EXPECT_THAT(error(doc), HasSubstr("not an RFC 3339 time"));
  doc = kLedger;
  doc.replace(doc.find("\"orphans\": ["), 12, "\"orphans\": [1,");
  EXPECT_EQ(error(doc), "problems.orphans[0]: expected an object");
}

}  // namespace
}  // namespace tessera::explain
