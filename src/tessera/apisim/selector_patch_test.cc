#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

#include "tessera/apisim/patch.h"
#include "tessera/apisim/selector.h"

namespace tessera::apisim {
namespace {

using Json = nlohmann::json;

bool LabelsMatch(const std::string& sel, const Fields& labels) {
  absl::StatusOr<LabelSelector> s = LabelSelector::Parse(sel);
  EXPECT_TRUE(s.ok()) << sel << ": " << s.status();
  return s.ok() && s->Matches(labels);
}

TEST(LabelSelectorTest, AllOperators) {
  Fields l = {{"app", "web"}, {"tier", "front"}, {"n", "5"}};
  EXPECT_TRUE(LabelsMatch("", l));
  EXPECT_TRUE(LabelsMatch("app=web", l));
  EXPECT_TRUE(LabelsMatch("app==web", l));
  EXPECT_FALSE(LabelsMatch("app!=web", l));
  EXPECT_TRUE(LabelsMatch("missing!=x", l));  // != matches objects without the key
  EXPECT_TRUE(LabelsMatch("app in (db, web)", l));
  EXPECT_FALSE(LabelsMatch("app notin (db,web)", l));
  EXPECT_TRUE(LabelsMatch("missing notin (a)", l));
  EXPECT_TRUE(LabelsMatch("tier", l));
  EXPECT_FALSE(LabelsMatch("!tier", l));
  EXPECT_TRUE(LabelsMatch("!missing", l));
  EXPECT_TRUE(LabelsMatch("n>4,n<6", l));
  EXPECT_FALSE(LabelsMatch("app=web,tier=back", l));
  EXPECT_TRUE(LabelsMatch("example.com/key!=v", l));
}

TEST(LabelSelectorTest, RejectsGarbage) {
  for (const char* bad : {"app=", "=x", "app in web", "app in (a", "n>x", "a b", "a,,b", "!"}) {
    if (std::string(bad) == "app=") {
      continue;  // an empty value is valid
    }
    EXPECT_FALSE(LabelSelector::Parse(bad).ok()) << bad;
  }
  EXPECT_TRUE(LabelSelector::Parse("app=").ok());
}

TEST(FieldSelectorTest, EqualsNotEqualsAndEscapes) {
  absl::StatusOr<FieldSelector> s =
      FieldSelector::Parse("status.phase!=Succeeded,status.phase!=Failed");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->Matches({{"status.phase", "Running"}}));
  EXPECT_FALSE(s->Matches({{"status.phase", "Failed"}}));
  s = FieldSelector::Parse("spec.nodeName==node-a");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->Matches({{"spec.nodeName", "node-a"}}));
  EXPECT_FALSE(s->Matches({}));
  s = FieldSelector::Parse("metadata.name=a\\,b\\=c");
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->terms().size(), 1u);
  EXPECT_EQ(s->terms()[0].value, "a,b=c");
  EXPECT_FALSE(FieldSelector::Parse("justaword").ok());
  EXPECT_FALSE(FieldSelector::Parse("a=b\\x").ok());
}

TEST(PatchTest, ContentTypes) {
  EXPECT_EQ(PatchTypeFromContentType("application/merge-patch+json; charset=utf-8"),
            PatchType::kMerge);
  EXPECT_EQ(PatchTypeFromContentType("application/json-patch+json"), PatchType::kJson);
  EXPECT_EQ(PatchTypeFromContentType("application/strategic-merge-patch+json"),
            PatchType::kStrategic);
  EXPECT_FALSE(PatchTypeFromContentType("application/apply-patch+yaml").has_value());
  EXPECT_FALSE(PatchTypeFromContentType("application/json").has_value());
}

TEST(PatchTest, MergeDeletesWithNullAndReplacesLists) {
  auto out =
      ApplyPatch(PatchType::kMerge, R"({"metadata":{"annotations":{"a":"1","b":"2"}},"l":[1,2]})",
                 R"({"metadata":{"annotations":{"a":null,"c":"3"}},"l":[9]})");
  ASSERT_TRUE(out.ok()) << out.status();
  Json j = Json::parse(*out);
  EXPECT_EQ(j["metadata"]["annotations"], Json({{"b", "2"}, {"c", "3"}}));
  EXPECT_EQ(j["l"], Json({9}));
}

TEST(PatchTest, StrategicMergesContainersByName) {
  const char* pod = R"({"spec":{"containers":[{"name":"a","image":"x"},{"name":"b","image":"y"}]},)"
                    R"("metadata":{"finalizers":["f1"]}})";
  auto out =
      ApplyPatch(PatchType::kStrategic, pod,
                 R"({"$setElementOrder/containers":[{"name":"a"},{"name":"b"}],)"
                 R"("spec":{"containers":[{"name":"b","image":"z"},{"name":"c","image":"w"}]},)"
                 R"("metadata":{"finalizers":["f2"]}})");
  ASSERT_TRUE(out.ok()) << out.status();
  Json j = Json::parse(*out);
  ASSERT_EQ(j["spec"]["containers"].size(), 3u);
  EXPECT_EQ(j["spec"]["containers"][0]["image"], "x");
  EXPECT_EQ(j["spec"]["containers"][1]["image"], "z");
  EXPECT_EQ(j["spec"]["containers"][2]["name"], "c");
  EXPECT_EQ(j["metadata"]["finalizers"], Json({"f1", "f2"}));
  out = ApplyPatch(PatchType::kStrategic, pod,
                   R"({"spec":{"containers":[{"name":"a","$patch":"delete"}]}})");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(Json::parse(*out)["spec"]["containers"].size(), 1u);
  out = ApplyPatch(PatchType::kStrategic, pod, R"({"spec":{"containers":[{"image":"q"}]}})");
  EXPECT_TRUE(absl::IsInvalidArgument(out.status()));
}

TEST(PatchTest, JsonPatchTestFailureIsUnprocessable) {
  const char* doc = R"({"metadata":{"annotations":{"k":"v"}}})";
  auto ok = ApplyPatch(PatchType::kJson, doc,
                       R"([{"op":"test","path":"/metadata/annotations/k","value":"v"},)"
                       R"({"op":"replace","path":"/metadata/annotations/k","value":"w"}])");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(Json::parse(*ok)["metadata"]["annotations"]["k"], "w");
  auto fail = ApplyPatch(PatchType::kJson, doc,
                         R"([{"op":"test","path":"/metadata/annotations/k","value":"nope"}])");
  EXPECT_TRUE(absl::IsFailedPrecondition(fail.status())) << fail.status();
  auto missing = ApplyPatch(PatchType::kJson, R"({"metadata":{}})",
                            R"([{"op":"add","path":"/metadata/annotations/a","value":"1"}])");
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyPatch(PatchType::kJson, doc, "{").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyPatch(PatchType::kJson, doc, "{}").status()));
  std::string many = "[";
  for (int i = 0; i < 10001; ++i) {
    many += std::string(i ? "," : "") + R"({"op":"test","path":"/metadata","value":{}})";
  }
  many += "]";
  EXPECT_TRUE(absl::IsResourceExhausted(ApplyPatch(PatchType::kJson, doc, many).status()));
}

TEST(PatchTest, RefusesDeepNesting) {
  std::string deep(5000, '[');
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyPatch(PatchType::kMerge, "{}", deep).status()));
}

}  // namespace
}  // namespace tessera::apisim
