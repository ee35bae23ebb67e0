#include "tessera/extender/webhook.h"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/apisim/patch.h"

namespace tessera::extender {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string SourceDir() {
  const char* dir = std::getenv("TESSERA_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string ReadTestdata(const std::string& name) {
  std::ifstream in(SourceDir() + "/test/testdata/webhook/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What the API server would do with a reply: the review, the decoded patch, and the pod the
// patch produces.
struct Outcome {
  int http_status = 0;
  json review;
  json response;
  json patch;  // the decoded JSON Patch, or null
  json pod;    // request.object with the patch applied
};

Outcome Review(const std::string& body, const WebhookOptions& options = {}) {
  Outcome out;
  WebhookReply reply = HandleAdmissionReview("application/json", body, options);
  out.http_status = reply.http_status;
  out.review = json::parse(reply.body);
  out.response = out.review["response"];
  json request = json::parse(body);
  out.pod = request["request"]["object"];
  if (out.response.contains("patch")) {
    EXPECT_EQ(out.response["patchType"], "JSONPatch");
    std::string patch;
    EXPECT_TRUE(absl::Base64Unescape(out.response["patch"].get<std::string>(), &patch));
    out.patch = json::parse(patch);
    absl::StatusOr<std::string> patched =
        apisim::ApplyPatch(apisim::PatchType::kJson, out.pod.dump(), patch);
    EXPECT_TRUE(patched.ok()) << patched.status() << "\n" << patch;
    if (patched.ok()) {
      out.pod = json::parse(*patched);
    }
  } else {
    EXPECT_FALSE(out.response.contains("patchType"));
  }
  EXPECT_EQ(out.response["uid"], request["request"]["uid"]);
  EXPECT_EQ(out.review["apiVersion"], request["apiVersion"]);
  EXPECT_EQ(out.review["kind"], "AdmissionReview");
  return out;
}

Outcome RunFile(const std::string& name, const WebhookOptions& options = {}) {
  return Review(ReadTestdata(name), options);
}

json Limits(const json& pod, const std::string& list, int i) {
  return pod["spec"][list][i]["resources"]["limits"];
}

TEST(WebhookTest, MemoryOnlyGetsTheDefaultCountAndOurScheduler) {
  Outcome o = RunFile("gpumem-only.json");
  EXPECT_EQ(o.http_status, 200);
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_EQ(o.response["status"]["code"], 200);
  EXPECT_EQ(o.pod["spec"]["schedulerName"], "hami-scheduler");
  EXPECT_EQ(Limits(o.pod, "containers", 0),
            json({{"nvidia.com/gpumem", "4096"}, {"nvidia.com/gpu", "1"}}));
  // Exactly HAMi's two operations, with the RFC 6901 escape of the resource name.
  EXPECT_EQ(o.patch, json::parse(R"([
    {"op":"add","path":"/spec/containers/0/resources/limits/nvidia.com~1gpu","value":"1"},
    {"op":"replace","path":"/spec/schedulerName","value":"hami-scheduler"}])"));
}

TEST(WebhookTest, CountOnlyBecomesExclusive) {
  Outcome o = RunFile("gpu-only.json");
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_EQ(Limits(o.pod, "containers", 0),
            json({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "100"}}));
  EXPECT_EQ(o.pod["spec"]["schedulerName"], "hami-scheduler");
  EXPECT_EQ(o.pod["spec"]["containers"][0]["env"], json::parse(R"([{"name":"A","value":"1"}])"));
}

TEST(WebhookTest, WholeMemoryPercentageBecomesExclusive) {
  Outcome o = RunFile("percentage-100.json");
  EXPECT_EQ(Limits(o.pod, "containers", 0), json({{"nvidia.com/gpumem-percentage", "100"},
                                                  {"nvidia.com/gpu", "1"},
                                                  {"nvidia.com/gpucores", "100"}}));
}

TEST(WebhookTest, FullRequestOnlyChangesTheScheduler) {
  Outcome o = RunFile("gpu-and-memory.json");
  EXPECT_EQ(o.patch, json::parse(R"([
    {"op":"replace","path":"/spec/schedulerName","value":"hami-scheduler"}])"));
}

TEST(WebhookTest, InitContainersAndPriority) {
  Outcome o = RunFile("init-and-priority.json");
  ASSERT_TRUE(o.response["allowed"]);
  // The init container's memory request is partial: no count to add, no exclusive cores.
  EXPECT_EQ(Limits(o.pod, "initContainers", 0),
            json({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1024"}}));
  EXPECT_EQ(Limits(o.pod, "containers", 0), json({{"cpu", "100m"}}));
  EXPECT_FALSE(o.pod["spec"]["containers"][0].contains("env"));
  EXPECT_EQ(
      Limits(o.pod, "containers", 1),
      json({{"nvidia.com/gpucores", "50"}, {"nvidia.com/priority", "1"}, {"nvidia.com/gpu", "1"}}));
  EXPECT_EQ(o.pod["spec"]["containers"][1]["env"],
            json::parse(R"([{"name":"CUDA_TASK_PRIORITY","value":"1"}])"));
  EXPECT_EQ(o.pod["spec"]["schedulerName"], "hami-scheduler");
}

TEST(WebhookTest, PercentageOutOfRangeIsErrored) {
  Outcome o = RunFile("percentage-invalid.json");
  EXPECT_EQ(o.http_status, 200);
  EXPECT_FALSE(o.response["allowed"]);
  EXPECT_EQ(o.response["status"]["code"], 500);
  EXPECT_EQ(o.response["status"]["message"],
            "invalid nvidia.com/gpumem-percentage value 150 in container main: must be an "
            "integer between 0 and 100");
}

TEST(WebhookTest, PrivilegedContainerWithAGpuIsDenied) {
  Outcome o = RunFile("privileged.json");
  EXPECT_FALSE(o.response["allowed"]);
  EXPECT_EQ(o.response["status"]["code"], 403);
  EXPECT_EQ(o.response["status"]["reason"], "Forbidden");
  EXPECT_EQ(o.response["status"]["message"], "container main is privileged");
}

TEST(WebhookTest, PrivilegedSidecarOfAGpuPodIsDenied) {
  Outcome o = RunFile("privileged-other-container.json");
  EXPECT_FALSE(o.response["allowed"]);
  EXPECT_EQ(o.response["status"]["message"], "container debug is privileged");
}

TEST(WebhookTest, PrivilegedPodWithoutGpuIsLeftAlone) {
  Outcome o = RunFile("privileged-no-gpu.json");
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_TRUE(o.patch.is_null());
}

TEST(WebhookTest, BoundGpuPodIsDenied) {
  Outcome o = RunFile("bound.json");
  EXPECT_FALSE(o.response["allowed"]);
  EXPECT_EQ(o.response["status"]["code"], 403);
  EXPECT_EQ(o.response["status"]["message"], "pod has node assigned");
}

TEST(WebhookTest, BoundPodWithoutGpuIsAllowed) {
  Outcome o = RunFile("bound-no-gpu.json");
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_TRUE(o.patch.is_null());
}

TEST(WebhookTest, WithoutASchedulerNameNothingIsDeniedForBeingBound) {
  WebhookOptions options;
  options.scheduler_name = "";
  Outcome o = RunFile("bound.json", options);
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_EQ(o.pod["spec"]["schedulerName"], "default-scheduler");
  EXPECT_EQ(Limits(o.pod, "containers", 0)["nvidia.com/gpucores"], "100");
}

TEST(WebhookTest, AnotherSchedulerIsLeftAlone) {
  Outcome o = RunFile("other-scheduler.json");
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_TRUE(o.patch.is_null());
  EXPECT_EQ(o.response["status"]["message"], "pod already has different scheduler assigned");
}

TEST(WebhookTest, DefaultSchedulerKeptWhenNotForced) {
  WebhookOptions options;
  options.force_overwrite_default_scheduler = false;
  Outcome o = RunFile("gpu-only.json", options);
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_TRUE(o.patch.is_null());
}

TEST(WebhookTest, OursAlreadyAndComplete) {
  Outcome o = RunFile("ours-already.json");
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_TRUE(o.patch.is_null());
}

TEST(WebhookTest, PodsWithoutGpusAreNotTouched) {
  for (const char* name : {"no-gpu.json", "no-resources.json"}) {
    Outcome o = RunFile(name);
    EXPECT_TRUE(o.response["allowed"]) << name;
    EXPECT_TRUE(o.patch.is_null()) << name;
    EXPECT_EQ(o.pod["spec"]["schedulerName"], "default-scheduler") << name;
  }
}

TEST(WebhookTest, V1beta1IsEchoed) {
  Outcome o = RunFile("v1beta1.json");
  EXPECT_EQ(o.review["apiVersion"], "admission.k8s.io/v1beta1");
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_EQ(Limits(o.pod, "containers", 0)["nvidia.com/gpu"], "1");
}

TEST(WebhookTest, NoContainersIsDenied) {
  Outcome o = RunFile("no-containers.json");
  EXPECT_FALSE(o.response["allowed"]);
  EXPECT_EQ(o.response["status"]["message"], "pod has no containers");
}

TEST(WebhookTest, OverwriteEnvHidesDevicesFromContainersWithoutOne) {
  WebhookOptions options;
  options.nvidia.overwrite_env = true;
  Outcome o = RunFile("init-and-priority.json", options);
  // Only the sidecar (no device) gets it; it had no env list.
  EXPECT_EQ(o.pod["spec"]["containers"][0]["env"],
            json::parse(R"([{"name":"NVIDIA_VISIBLE_DEVICES","value":"none"}])"));
  EXPECT_FALSE(o.pod["spec"]["initContainers"][0].contains("env"));
  EXPECT_EQ(o.pod["spec"]["containers"][1]["env"].size(), 1u);
  // A GPU-less pod gets it too, and nothing else.
  Outcome plain = RunFile("no-gpu.json", options);
  EXPECT_EQ(plain.pod["spec"]["containers"][0]["env"],
            json::parse(R"([{"name":"NVIDIA_VISIBLE_DEVICES","value":"none"}])"));
  EXPECT_EQ(plain.pod["spec"]["schedulerName"], "default-scheduler");
}

TEST(WebhookTest, CorePolicyAndRuntimeClass) {
  WebhookOptions options;
  options.nvidia.gpu_core_policy = device::GpuCorePolicy::kForce;
  options.nvidia.runtime_class_name = "nvidia";
  Outcome o = RunFile("gpu-only.json", options);
  // Appended after the existing variable.
  EXPECT_EQ(o.pod["spec"]["containers"][0]["env"], json::parse(R"([{"name":"A","value":"1"},
      {"name":"GPU_CORE_UTILIZATION_POLICY","value":"force"}])"));
  EXPECT_EQ(o.pod["spec"]["runtimeClassName"], "nvidia");
}

TEST(WebhookTest, DefaultGpuNumZeroAddsNoCount) {
  WebhookOptions options;
  options.nvidia.default_gpu_num = 0;
  Outcome o = RunFile("gpumem-only.json", options);
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_TRUE(o.patch.is_null());
  o = RunFile("percentage-100.json", options);
  EXPECT_TRUE(o.patch.is_null());
}

TEST(WebhookTest, DefaultMemoryMakesACountOnlyRequestShared) {
  WebhookOptions options;
  options.nvidia.default_memory = 2048;
  Outcome o = RunFile("gpu-only.json", options);
  EXPECT_FALSE(Limits(o.pod, "containers", 0).contains("nvidia.com/gpucores"));
  EXPECT_EQ(o.pod["spec"]["schedulerName"], "hami-scheduler");
}

TEST(WebhookTest, ResourceNamesComeFromTheDeviceConfig) {
  WebhookOptions options;
  options.nvidia.resource_count_name = "example.com/vgpu";
  options.nvidia.resource_memory_name = "example.com/vgpu-memory";
  options.scheduler_name = "tessera";
  std::string body = ReadTestdata("gpumem-only.json");
  // Under other names the stock resource is not managed.
  Outcome o = Review(body, options);
  EXPECT_TRUE(o.patch.is_null());
  json doc = json::parse(body);
  doc["request"]["object"]["spec"]["containers"][0]["resources"]["limits"] =
      json{{"example.com/vgpu-memory", "1000"}};
  o = Review(doc.dump(), options);
  EXPECT_EQ(Limits(o.pod, "containers", 0)["example.com/vgpu"], "1");
  EXPECT_EQ(o.pod["spec"]["schedulerName"], "tessera");
}

TEST(WebhookTest, CoresOnlyGetsACountAndInitContainersWithoutResourcesAreUntouched) {
  json doc = json::parse(ReadTestdata("no-resources.json"));
  doc["request"]["object"]["spec"]["initContainers"] =
      json::array({{{"name", "a"}, {"image", "x"}}});
  doc["request"]["object"]["spec"]["containers"][0]["resources"]["limits"] =
      json{{"nvidia.com/gpucores", "20"}};
  Outcome o = Review(doc.dump());
  EXPECT_EQ(Limits(o.pod, "containers", 0),
            json({{"nvidia.com/gpucores", "20"}, {"nvidia.com/gpu", "1"}}));
  EXPECT_FALSE(o.pod["spec"]["initContainers"][0].contains("resources"));
}

TEST(WebhookTest, SchedulerNameAbsentIsAdded) {
  json doc = json::parse(ReadTestdata("gpu-only.json"));
  doc["request"]["object"]["spec"].erase("schedulerName");
  Outcome o = Review(doc.dump());
  EXPECT_EQ(o.pod["spec"]["schedulerName"], "hami-scheduler");
  EXPECT_THAT(o.patch.dump(), HasSubstr(R"("op":"add","path":"/spec/schedulerName")"));
}

TEST(WebhookTest, OtherOperationsAndResourcesAreAllowedUnchanged) {
  json doc = json::parse(ReadTestdata("gpu-only.json"));
  for (const char* operation : {"DELETE", "CONNECT"}) {
    doc["request"]["operation"] = operation;
    Outcome o = Review(doc.dump());
    EXPECT_TRUE(o.response["allowed"]);
    EXPECT_TRUE(o.patch.is_null());
  }
  doc["request"]["operation"] = "CREATE";
  doc["request"]["subResource"] = "ephemeralcontainers";
  Outcome o = Review(doc.dump());
  EXPECT_TRUE(o.patch.is_null());
}

// ---- scheduler-owned annotations (HAMi PR #3042) ---------------------------------------------

// `file` with metadata.annotations set to `annotations`.
std::string WithAnnotations(const std::string& file, const json& annotations) {
  json doc = json::parse(ReadTestdata(file));
  doc["request"]["object"]["metadata"]["annotations"] = annotations;
  return doc.dump();
}

// Every annotation Tessera writes on a pod: HAMi's five, the MIG reservations, the filter time
// and the verdict.
const std::vector<std::string> kOwned = {"hami.io/vgpu-node",
                                         "hami.io/bind-time",
                                         "hami.io/bind-phase",
                                         "hami.io/vgpu-devices-to-allocate",
                                         "hami.io/vgpu-devices-allocated",
                                         "hami.io/vgpu-mig-allocations",
                                         "hami.io/vgpu-time",
                                         "tessera.io/verdict"};

TEST(WebhookTest, EachSchedulerOwnedAnnotationDeniesACreate) {
  for (const std::string& key : kOwned) {
    SCOPED_TRACE(key);
    // Present with any value, even empty.
    Outcome o = Review(WithAnnotations("gpu-only.json", {{key, ""}}));
    EXPECT_FALSE(o.response["allowed"]);
    EXPECT_EQ(o.response["status"]["code"], 403);
    EXPECT_EQ(o.response["status"]["reason"], "Forbidden");
    EXPECT_EQ(
        o.response["status"]["message"],
        "annotation " + key + " is written by the scheduler and cannot be set when creating a pod");
    EXPECT_TRUE(o.patch.is_null());
  }
}

TEST(WebhookTest, SchedulerOwnedAnnotationIsDeniedWhateverTheSchedulerOrRequest) {
  // Another scheduler's pod (left alone otherwise), a pod asking for no GPU, and a webhook
  // without --scheduler-name: all denied, since the annotations would be read as an allocation.
  const json forged = {{"hami.io/vgpu-node", "gpu-node-1"},
                       {"hami.io/vgpu-devices-allocated", "GPU-1,NVIDIA,20000,100:;"}};
  WebhookOptions no_name;
  no_name.scheduler_name = "";
  for (const auto& [file, options] : std::vector<std::pair<std::string, WebhookOptions>>{
           {"other-scheduler.json", {}}, {"no-gpu.json", {}}, {"gpu-only.json", no_name}}) {
    SCOPED_TRACE(file);
    Outcome o = Review(WithAnnotations(file, forged), options);
    EXPECT_FALSE(o.response["allowed"]);
    // The fixed keys are checked in order: hami.io/vgpu-node first.
    EXPECT_EQ(o.response["status"]["message"],
              "annotation hami.io/vgpu-node is written by the scheduler and cannot be set when "
              "creating a pod");
  }
}

TEST(WebhookTest, OtherHamiAnnotationsAreAllowedOnCreate) {
  // Not scheduler-owned: user hints and policies.
  Outcome o = Review(WithAnnotations("gpu-only.json", {{"hami.io/numa-alignment", "strict"},
                                                       {"hami.io/gpu-scheduler-policy", "spread"},
                                                       {"nvidia.com/use-gputype", "A100"}}));
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_EQ(o.pod["spec"]["schedulerName"], "hami-scheduler");
}

// ---- UPDATE: the scheduler-owned annotations of a pod change only by their writers ------------

const char kTenant[] = "alice";
const char kSelf[] = "system:serviceaccount:tessera-system:tessera";
const char kPlugin[] = "system:serviceaccount:kube-system:hami-device-plugin";

// A bound pod as the scheduler and the plugin leave it.
json BoundAnnotations() {
  return {{"hami.io/vgpu-node", "gpu-node-1"},
          {"hami.io/vgpu-time", "1757923200"},
          {"hami.io/bind-time", "1757923201"},
          {"hami.io/bind-phase", "allocating"},
          {"hami.io/vgpu-devices-to-allocate", "GPU-1,NVIDIA,12000,50:;"},
          {"hami.io/vgpu-devices-allocated", "GPU-1,NVIDIA,12000,50:;"},
          {"hami.io/vgpu-mig-allocations",
           R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb",)"
           R"("placement":{"start":6,"size":1}}])"},
          {"tessera.io/verdict", "{}"},
          {"team", "ml"}};
}

// An UPDATE of gpu-only.json's pod from `before` to `after` annotations by `username`.
std::string UpdateReview(const json& before, const json& after, const std::string& username,
                         const json& groups = {"system:authenticated"}) {
  json doc = json::parse(ReadTestdata("gpu-only.json"));
  json& request = doc["request"];
  request["operation"] = "UPDATE";
  request["name"] = "p";
  request["oldObject"] = request["object"];
  request["oldObject"]["metadata"]["annotations"] = before;
  request["object"]["metadata"]["annotations"] = after;
  request["userInfo"] = {{"username", username}, {"uid", "u-1"}, {"groups", groups}};
  return doc.dump();
}

WebhookOptions UpdateOptions() {
  WebhookOptions o;
  o.self_username = kSelf;
  o.trusted_annotation_writers = {kPlugin};
  return o;
}

TEST(WebhookTest, ATenantCannotAddChangeOrRemoveAnOwnedAnnotation) {
  for (const std::string& key : kOwned) {
    SCOPED_TRACE(key);
    json changed = BoundAnnotations();
    changed[key] = "GPU-1,NVIDIA,1,50:;";
    json removed = BoundAnnotations();
    removed.erase(key);
    json before_absent = BoundAnnotations();
    before_absent.erase(key);
    for (const auto& [before, after] :
         std::vector<std::pair<json, json>>{{BoundAnnotations(), changed},
                                            {BoundAnnotations(), removed},
                                            {before_absent, BoundAnnotations()}}) {
      Outcome o = Review(UpdateReview(before, after, kTenant), UpdateOptions());
      EXPECT_EQ(o.http_status, 200);
      EXPECT_FALSE(o.response["allowed"]);
      EXPECT_EQ(o.response["status"]["code"], 403);
      EXPECT_EQ(o.response["status"]["reason"], "Forbidden");
      EXPECT_EQ(o.response["status"]["message"],
                "annotation " + key + " is written by the scheduler and cannot be set by alice");
      EXPECT_TRUE(o.patch.is_null());
    }
  }
  // All annotations dropped (kubectl replace without them): the first key is named.
  Outcome o = Review(UpdateReview(BoundAnnotations(), json::object(), kTenant), UpdateOptions());
  EXPECT_EQ(o.response["status"]["message"],
            "annotation hami.io/vgpu-node is written by the scheduler and cannot be set by alice");
}

TEST(WebhookTest, UpdatesLeavingOwnedAnnotationsAloneAreAllowedUnchanged) {
  json after = BoundAnnotations();
  after["team"] = "vision";
  after["note"] = "x";
  Outcome o = Review(UpdateReview(BoundAnnotations(), after, kTenant), UpdateOptions());
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_TRUE(o.patch.is_null());
  EXPECT_EQ(o.response["status"]["message"], "no scheduler-owned annotation changed");
  // No annotations at all on either side.
  o = Review(UpdateReview(json::object(), json::object(), kTenant), UpdateOptions());
  EXPECT_TRUE(o.response["allowed"]);
}

TEST(WebhookTest, TheSchedulerItselfMayWriteEveryOwnedAnnotation) {
  // The filter patch on a pending pod, the bind patch, a verdict, its removal.
  json bound = BoundAnnotations();
  json filtered = bound;
  for (const char* key : {"hami.io/bind-time", "hami.io/bind-phase"}) {
    filtered.erase(key);
  }
  for (const auto& [before, after] :
       std::vector<std::pair<json, json>>{{json::object(), filtered},
                                          {filtered, bound},
                                          {json::object(), {{"tessera.io/verdict", "{}"}}},
                                          {{{"tessera.io/verdict", "{}"}}, json::object()}}) {
    Outcome o = Review(UpdateReview(before, after, kSelf), UpdateOptions());
    EXPECT_TRUE(o.response["allowed"]) << o.response.dump();
    EXPECT_TRUE(o.patch.is_null());
  }
  // Without --self-username nobody is the scheduler.
  WebhookOptions nobody = UpdateOptions();
  nobody.self_username = "";
  Outcome o = Review(UpdateReview(json::object(), filtered, ""), nobody);
  EXPECT_FALSE(o.response["allowed"]);
  EXPECT_EQ(o.response["status"]["message"],
            "annotation hami.io/vgpu-node is written by the scheduler and cannot be set by an "
            "anonymous request");
}

TEST(WebhookTest, ClusterSuperusersMayWriteEveryOwnedAnnotation) {
  // system:masters bypasses authorization and may delete the webhook itself: no check stops it,
  // and repairs by hand (or a test bed standing in for the scheduler) need it.
  json changed = BoundAnnotations();
  changed["hami.io/vgpu-devices-allocated"] = "GPU-2,NVIDIA,1,50:;";
  Outcome o = Review(UpdateReview(BoundAnnotations(), changed, "admin",
                                  {"system:masters", "system:authenticated"}),
                     UpdateOptions());
  EXPECT_TRUE(o.response["allowed"]) << o.response.dump();
  // A group of another name is no pass.
  o = Review(UpdateReview(BoundAnnotations(), changed, "admin", {"masters", "system:admins"}),
             UpdateOptions());
  EXPECT_FALSE(o.response["allowed"]);
}

TEST(WebhookTest, TheDevicePluginMayWriteOnlyWhatItWritesAtAllocate) {
  const json bound = BoundAnnotations();
  // bind-phase success and failed, the consumed to-allocate (HEAD's index-preserving form), the
  // MIG runtime identity: HAMi's device plugin (docs/hami-device-plugin.md §2.4, §3.1).
  json success = bound;
  success["hami.io/bind-phase"] = "success";
  success["hami.io/vgpu-devices-to-allocate"] = ";;";
  success["hami.io/vgpu-mig-allocations"] =
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb",)"
      R"("placement":{"start":6,"size":1},"migUUID":"MIG-9","gpuInstanceID":13,)"
      R"("computeInstanceID":0}])";
  json failed = bound;
  failed["hami.io/bind-phase"] = "failed";
  for (const json& after : {success, failed}) {
    Outcome o = Review(UpdateReview(bound, after, kPlugin), UpdateOptions());
    EXPECT_TRUE(o.response["allowed"]) << o.response.dump();
  }
  // The allocation itself, the node, the times and the verdict stay the scheduler's.
  for (const char* key : {"hami.io/vgpu-devices-allocated", "hami.io/vgpu-node",
                          "hami.io/bind-time", "hami.io/vgpu-time", "tessera.io/verdict"}) {
    SCOPED_TRACE(key);
    json after = success;
    after[key] = "1";
    Outcome o = Review(UpdateReview(bound, after, kPlugin), UpdateOptions());
    EXPECT_FALSE(o.response["allowed"]);
    EXPECT_EQ(o.response["status"]["message"],
              std::string("annotation ") + key +
                  " is written by the scheduler and cannot be set by " + kPlugin);
  }
  // The plugin's name is no pass for anyone else, nor is its group.
  Outcome o = Review(UpdateReview(bound, success, "system:serviceaccount:ml:hami-device-plugin"),
                     UpdateOptions());
  EXPECT_FALSE(o.response["allowed"]);
  // Without trusted writers the plugin is a tenant like any other.
  WebhookOptions none = UpdateOptions();
  none.trusted_annotation_writers.clear();
  o = Review(UpdateReview(bound, success, kPlugin), none);
  EXPECT_FALSE(o.response["allowed"]);
  // HAMi's chart's plugin is trusted by default.
  o = Review(UpdateReview(bound, success, kPlugin));
  EXPECT_TRUE(o.response["allowed"]);
}

TEST(WebhookTest, UpdatesOfSubresourcesAreJudgedAlike) {
  json changed = BoundAnnotations();
  changed["hami.io/vgpu-devices-allocated"] = "GPU-1,NVIDIA,1,50:;";
  json doc = json::parse(UpdateReview(BoundAnnotations(), changed, kTenant));
  doc["request"]["subResource"] = "ephemeralcontainers";
  Outcome o = Review(doc.dump(), UpdateOptions());
  EXPECT_FALSE(o.response["allowed"]);
  // A user name with control characters is quoted in the message.
  o = Review(UpdateReview(BoundAnnotations(), changed, "eve\x1b[2J"), UpdateOptions());
  EXPECT_EQ(o.response["status"]["message"],
            "annotation hami.io/vgpu-devices-allocated is written by the scheduler and cannot be "
            "set by \"eve\\x1b[2J\"");
}

TEST(WebhookTest, MalformedUpdatesAre400) {
  const json good = json::parse(UpdateReview(BoundAnnotations(), BoundAnnotations(), kTenant));
  struct Case {
    std::string name;
    std::function<void(json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no oldObject", [](json& d) { d["request"].erase("oldObject"); },
       "request.oldObject: missing"},
      {"null oldObject", [](json& d) { d["request"]["oldObject"] = nullptr; },
       "request.oldObject: missing"},
      {"oldObject not an object", [](json& d) { d["request"]["oldObject"] = "x"; },
       "request.oldObject: expected an object"},
      {"no object", [](json& d) { d["request"].erase("object"); }, "request.object: missing"},
      {"userInfo not an object", [](json& d) { d["request"]["userInfo"] = json::array(); },
       "request.userInfo: expected an object"},
      {"username not a string", [](json& d) { d["request"]["userInfo"]["username"] = 7; },
       "request.userInfo.username: expected a string"},
      {"groups not an array", [](json& d) { d["request"]["userInfo"]["groups"] = "g"; },
       "request.userInfo.groups: expected an array of strings"},
      {"a group not a string",
       [](json& d) {
         d["request"]["userInfo"]["groups"] = json::array({"a", 1});
       },
       "request.userInfo.groups: expected an array of strings"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    json doc = good;
    c.edit(doc);
    WebhookReply reply = HandleAdmissionReview("application/json", doc.dump(), UpdateOptions());
    EXPECT_EQ(reply.http_status, 400);
    json review = json::parse(reply.body);
    EXPECT_FALSE(review["response"]["allowed"]);
    EXPECT_EQ(review["response"]["status"]["message"], c.message);
  }
}

TEST(WebhookTest, TheOwnedListIsTheOneDeclared) {
  std::vector<std::string> declared(SchedulerOwnedAnnotations().begin(),
                                    SchedulerOwnedAnnotations().end());
  EXPECT_EQ(declared, kOwned);
  for (std::string_view key : DevicePluginAnnotations()) {
    EXPECT_THAT(declared, ::testing::Contains(std::string(key)));
  }
}

// The quoted annotation keys of a manifest's owned-annotation-set-or-changed condition.
std::vector<std::string> QuotedKeys(const std::string& path) {
  std::ifstream in(SourceDir() + "/" + path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string> keys;
  const size_t start = text.find("owned-annotation-set-or-changed");
  EXPECT_NE(start, std::string::npos) << path;
  const size_t begin = text.find('[', start);
  const size_t end = text.find(']', begin);
  // 'a', 'b', ... between the brackets.
  for (size_t open = text.find('\'', begin); open < end; open = text.find('\'', open + 1)) {
    const size_t close = text.find('\'', open + 1);
    keys.push_back(text.substr(open + 1, close - open - 1));
    open = close;
  }
  return keys;
}

TEST(WebhookTest, TheManifestsCallTheWebhookForExactlyTheOwnedAnnotations) {
  // deploy/base and the Helm chart send an UPDATE only when one of these keys differs
  // (matchConditions): a key missing there would let a tenant rewrite it unchecked.
  for (const char* path :
       {"deploy/base/webhook.yaml", "deploy/helm/tessera/templates/webhook.yaml"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(QuotedKeys(path), kOwned);
  }
}

std::string Jwt(const json& claims) {
  return absl::WebSafeBase64Escape(R"({"alg":"RS256","kid":"k"})") + "." +
         absl::WebSafeBase64Escape(claims.dump()) + ".c2lnbmF0dXJl";
}

TEST(WebhookTest, ServiceAccountUsernameIsTheTokensSubject) {
  absl::StatusOr<std::string> user =
      ServiceAccountUsername(Jwt({{"iss", "https://kubernetes.default.svc"},
                                  {"sub", "system:serviceaccount:tessera-system:tessera"},
                                  {"kubernetes.io", {{"namespace", "tessera-system"}}}}));
  ASSERT_TRUE(user.ok()) << user.status();
  EXPECT_EQ(*user, "system:serviceaccount:tessera-system:tessera");
  struct Bad {
    std::string token;
    std::string message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"", "the token is not a JWT (want three dot-separated parts)"},
           {"a.b", "the token is not a JWT (want three dot-separated parts)"},
           {"a.!!!.c", "the token's payload is not base64url"},
           {Jwt({{"sub", "alice"}}), "the token's subject \"alice\" is not a service account"},
           {Jwt({{"sub", "system:serviceaccount:ns"}}),
            "the token's subject \"system:serviceaccount:ns\" is not a service account"},
           {Jwt({{"sub", "system:serviceaccount::sa"}}),
            "the token's subject \"system:serviceaccount::sa\" is not a service account"},
           {Jwt({{"sub", "system:serviceaccount:ns:sa:x"}}),
            "the token's subject \"system:serviceaccount:ns:sa:x\" is not a service account"},
           {Jwt({{"sub", 7}}), "the token's subject \"\" is not a service account"},
           {absl::WebSafeBase64Escape("{}") + "." + absl::WebSafeBase64Escape("[1]") + ".s",
            "the token's subject \"\" is not a service account"},
       }) {
    SCOPED_TRACE(b.token);
    absl::StatusOr<std::string> r = ServiceAccountUsername(b.token);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), b.message);
  }
}

// ---- warnings (admission_warnings.h; kubectl prints them) ---------------------------------------

TEST(WebhookTest, ACountWithoutMemoryIsWarnedAsWholeGpus) {
  Outcome o = RunFile("gpu-only.json");
  ASSERT_TRUE(o.response["allowed"]);
  EXPECT_EQ(o.response["warnings"],
            json::array({"container \"main\" asks for nvidia.com/gpu: 1 without nvidia.com/gpumem "
                         "or nvidia.com/gpumem-percentage: each of its GPUs is booked whole, not "
                         "shared (the device config's defaultMemory is 0); give nvidia.com/gpumem "
                         "to share a GPU"}));
  // With a default memory, the same pod books that much and is not warned.
  WebhookOptions shared;
  shared.nvidia.default_memory = 2000;
  EXPECT_FALSE(RunFile("gpu-only.json", shared).response.contains("warnings"));
  // Memory given, or a percentage: no warning.
  EXPECT_FALSE(RunFile("gpu-and-memory.json").response.contains("warnings"));
  EXPECT_FALSE(RunFile("percentage-100.json").response.contains("warnings"));
}

TEST(WebhookTest, DeviceResourcesWrittenAsAnnotationsAreWarned) {
  // HAMi #2862: the annotation form is read by nothing; the pod gets the whole card.
  Outcome o = Review(WithAnnotations(
      "gpu-and-memory.json", {{"nvidia.com/gpumem", "4000"}, {"nvidia.com/gpucores", "30"}}));
  ASSERT_TRUE(o.response["allowed"]);
  EXPECT_EQ(o.response["warnings"],
            json::array({"annotation nvidia.com/gpumem is not read by the scheduler or the device "
                         "plugin: give it in the containers' resources.limits",
                         "annotation nvidia.com/gpucores is not read by the scheduler or the "
                         "device plugin: give it in the containers' resources.limits"}));
  // A pod asking for no device through its resources is warned too: it meant to ask for one.
  EXPECT_THAT(Review(WithAnnotations("no-gpu.json", {{"nvidia.com/gpumem", "4000"}}))
                  .response["warnings"]
                  .dump(),
              HasSubstr("annotation nvidia.com/gpumem is not read"));
}

TEST(WebhookTest, PolicyAnnotationsTheSchedulerRefusesAreWarned) {
  Outcome o =
      Review(WithAnnotations("gpu-and-memory.json", {{"hami.io/gpu-scheduler-policy", "binpak"}}));
  ASSERT_TRUE(o.response["allowed"]);
  ASSERT_EQ(o.response["warnings"].size(), 1u);
  EXPECT_THAT(o.response["warnings"][0].get<std::string>(),
              HasSubstr("the scheduler will refuse this pod: hami.io/gpu-scheduler-policy: "));
  EXPECT_THAT(o.response["warnings"][0].get<std::string>(), HasSubstr("binpak"));
  o = Review(WithAnnotations("gpu-and-memory.json", {{"nvidia.com/numa-bind", "yes"}}));
  EXPECT_THAT(o.response["warnings"].dump(), HasSubstr("nvidia.com/numa-bind: not a boolean"));
  // Valid values are not warned.
  o = Review(WithAnnotations("gpu-and-memory.json", {{"hami.io/gpu-scheduler-policy", "spread"},
                                                     {"hami.io/node-scheduler-policy", "binpack"},
                                                     {"nvidia.com/numa-bind", "true"}}));
  EXPECT_FALSE(o.response.contains("warnings"));
}

TEST(WebhookTest, OtherSchedulersPodsAndDenialsCarryNoWarnings) {
  EXPECT_FALSE(Review(WithAnnotations("other-scheduler.json", {{"nvidia.com/gpumem", "4000"}}))
                   .response.contains("warnings"));
  Outcome denied = Review(WithAnnotations("privileged.json", {{"nvidia.com/gpumem", "4000"}}));
  EXPECT_FALSE(denied.response["allowed"]);
  EXPECT_FALSE(denied.response.contains("warnings"));
}

// ---- malformed reviews -------------------------------------------------------------------------

json Bad(std::string_view content_type, std::string_view body) {
  WebhookReply reply = HandleAdmissionReview(content_type, body, WebhookOptions{});
  EXPECT_EQ(reply.http_status, 400) << body;
  json review = json::parse(reply.body);
  EXPECT_EQ(review["kind"], "AdmissionReview");
  EXPECT_FALSE(review["response"]["allowed"]);
  EXPECT_EQ(review["response"]["status"]["code"], 400);
  return review["response"]["status"]["message"];
}

TEST(WebhookTest, MalformedReviewsAre400WithAMessage) {
  const std::string good = ReadTestdata("gpu-only.json");
  EXPECT_EQ(Bad("application/json", ""), "request body is empty");
  EXPECT_THAT(Bad("text/plain", good).get<std::string>(), HasSubstr("expected application/json"));
  EXPECT_THAT(Bad("application/json", "{not json").get<std::string>(), HasSubstr("not JSON"));
  EXPECT_THAT(Bad("application/json", "[]").get<std::string>(), HasSubstr("JSON object"));
  EXPECT_THAT(
      Bad("application/json", std::string(600, '[') + std::string(600, ']')).get<std::string>(),
      HasSubstr("deeper than 512"));
  json doc = json::parse(good);
  doc["apiVersion"] = "v1";
  EXPECT_THAT(Bad("application/json", doc.dump()).get<std::string>(), HasSubstr("apiVersion"));
  doc = json::parse(good);
  doc["kind"] = "Pod";
  EXPECT_THAT(Bad("application/json", doc.dump()).get<std::string>(), HasSubstr("kind"));
  doc = json::parse(good);
  doc["request"].erase("uid");
  EXPECT_THAT(Bad("application/json", doc.dump()).get<std::string>(), HasSubstr("request.uid"));
  doc = json::parse(good);
  doc["request"]["uid"] = 7;
  EXPECT_THAT(Bad("application/json", doc.dump()).get<std::string>(), HasSubstr("request.uid"));
  doc = json::parse(good);
  doc["request"]["object"] = "pod";
  EXPECT_THAT(Bad("application/json", doc.dump()).get<std::string>(), HasSubstr("request.object"));
  doc = json::parse(good);
  doc["request"].erase("object");
  EXPECT_THAT(Bad("application/json", doc.dump()).get<std::string>(), HasSubstr("request.object"));
  doc = json::parse(good);
  doc.erase("request");
  EXPECT_THAT(Bad("application/json", doc.dump()).get<std::string>(), HasSubstr("request"));
  // A charset parameter is fine.
  EXPECT_EQ(HandleAdmissionReview("application/json; charset=utf-8", good, {}).http_status, 200);
}

TEST(WebhookTest, AnUpdateReviewDecodesWithItsOldObjectAndUser) {
  absl::StatusOr<AdmissionRequest> r =
      DecodeAdmissionReview(ReadTestdata("update-allocation-by-tenant.json"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->operation, "UPDATE");
  EXPECT_EQ(r->username, "system:serviceaccount:ml:default");
  EXPECT_EQ(r->groups,
            (std::vector<std::string>{"system:serviceaccounts", "system:serviceaccounts:ml",
                                      "system:authenticated"}));
  EXPECT_EQ(
      json::parse(r->old_object_json)["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"],
      "GPU-6f2e0d1c-0000-4000-8000-000000000001,NVIDIA,12000,0:;");
  EXPECT_EQ(
      json::parse(r->object_json)["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"],
      "GPU-6f2e0d1c-0000-4000-8000-000000000001,NVIDIA,1,0:;");
  Outcome o = RunFile("update-allocation-by-tenant.json");
  EXPECT_FALSE(o.response["allowed"]);
}

TEST(WebhookTest, EveryTestdataReviewDecodes) {
  for (const char* name : {"gpumem-only.json", "v1beta1.json", "bound.json"}) {
    absl::StatusOr<AdmissionRequest> r = DecodeAdmissionReview(ReadTestdata(name));
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_EQ(r->kind, "Pod");
    EXPECT_EQ(r->resource, "pods");
    EXPECT_EQ(r->operation, "CREATE");
    EXPECT_EQ(r->ns, "ml");
  }
}

}  // namespace
// ---- hami.io/numa-alignment (HAMi refs/pull/2731 pkg/scheduler/webhook.go:Handle) -----------

// Vectors of HAMi's pkg/scheduler/webhook_test.go:TestHandleNumaAlignmentAnnotation, plus the
// message of pkg/util/numa_alignment.go:ParseNumaAlignmentMode.
TEST(WebhookTest, BadNumaAlignmentIsDeniedWithHamisMessage) {
  for (const char* bad : {"bogus", "", "true"}) {
    SCOPED_TRACE(bad);
    Outcome o = Review(WithAnnotations("gpu-only.json", {{"hami.io/numa-alignment", bad}}));
    EXPECT_FALSE(o.response["allowed"]);
    EXPECT_EQ(o.response["status"]["code"], 403);
    EXPECT_EQ(o.response["status"]["message"],
              std::string("invalid hami.io/numa-alignment annotation \"") + bad +
                  "\": expected \"best-effort\" or \"strict\"");
    EXPECT_TRUE(o.patch.is_null());
  }
  // A pod asking for no GPU but ours is checked too (HAMi checks before looking at resources).
  Outcome o = Review(WithAnnotations("no-gpu.json", {{"hami.io/numa-alignment", "bogus"}}));
  EXPECT_FALSE(o.response["allowed"]);
}

TEST(WebhookTest, ValidNumaAlignmentIsAdmittedAndLeftAsWritten) {
  for (const char* good : {"best-effort", " STRICT ", "Best-Effort"}) {
    SCOPED_TRACE(good);
    Outcome o = Review(WithAnnotations("gpu-only.json", {{"hami.io/numa-alignment", good}}));
    EXPECT_TRUE(o.response["allowed"]);
    EXPECT_EQ(o.pod["spec"]["schedulerName"], "hami-scheduler");
    EXPECT_EQ(o.pod["metadata"]["annotations"]["hami.io/numa-alignment"], good);
  }
}

TEST(WebhookTest, NumaAlignmentOfAnotherSchedulersPodIsNotJudged) {
  Outcome o = Review(WithAnnotations("other-scheduler.json", {{"hami.io/numa-alignment", "x"}}));
  EXPECT_TRUE(o.response["allowed"]);
  EXPECT_EQ(o.response["status"]["message"], "pod already has different scheduler assigned");
}

}  // namespace tessera::extender
