#include "tessera/extender/admission_warnings.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/kube/decode.h"

namespace tessera::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

kube::Pod PodOf(const std::string& json) {
  absl::StatusOr<kube::Pod> pod = kube::DecodePod(json);
  EXPECT_TRUE(pod.ok()) << pod.status();
  return pod.ok() ? *pod : kube::Pod{};
}

TEST(AdmissionWarningsTest, InitContainersAndRequestsOnlyCountsAreWarnedToo) {
  const kube::Pod pod = PodOf(R"({"metadata":{"name":"p","namespace":"ml"},"spec":{
      "initContainers":[{"name":"setup","resources":{"requests":{"nvidia.com/gpu":"2"}}}],
      "containers":[{"name":"main","resources":{"limits":{"nvidia.com/gpu":"1",
                                                          "nvidia.com/gpumem":"1000"}}}]}})");
  EXPECT_THAT(
      AdmissionWarnings(pod, device::DefaultNvidiaConfig()),
      ElementsAre(HasSubstr("init container \"setup\" asks for nvidia.com/gpu: 2 without")));
}

TEST(AdmissionWarningsTest, ResourceNamesComeFromTheDeviceConfig) {
  device::NvidiaConfig config = device::DefaultNvidiaConfig();
  config.resource_count_name = "example.com/vgpu";
  config.resource_memory_name = "example.com/vmem";
  kube::Pod pod = PodOf(R"({"metadata":{"name":"p","annotations":{"nvidia.com/gpumem":"100"}},
      "spec":{"containers":[{"name":"main","resources":{"limits":{"example.com/vgpu":"1"}}}]}})");
  pod.meta.annotations.Set("example.com/vmem", "100");  // as the webhook passes every key
  EXPECT_THAT(AdmissionWarnings(pod, config),
              ElementsAre(HasSubstr("annotation example.com/vmem is not read"),
                          HasSubstr("asks for example.com/vgpu: 1 without example.com/vmem")));
}

TEST(AdmissionWarningsTest, ABoundedNumberOfBoundedWarnings) {
  std::string containers;
  for (int i = 0; i < 20; ++i) {
    containers += (i > 0 ? "," : "") + std::string(R"({"name":"c)") + std::string(200, 'x') +
                  std::to_string(i) + R"(","resources":{"limits":{"nvidia.com/gpu":"1"}}})";
  }
  const std::vector<std::string> w = AdmissionWarnings(
      PodOf(R"({"metadata":{"name":"p"},"spec":{"containers":[)" + containers + "]}}"),
      device::DefaultNvidiaConfig());
  ASSERT_THAT(w, SizeIs(kMaxAdmissionWarnings));
  for (const std::string& one : w) {
    EXPECT_LE(one.size(), kMaxAdmissionWarningBytes);
    EXPECT_TRUE(one.ends_with("...")) << one;
  }
}

TEST(AdmissionWarningsTest, AWellFormedPodHasNone) {
  EXPECT_THAT(AdmissionWarnings(PodOf(R"({"metadata":{"name":"p","annotations":{
      "hami.io/gpu-scheduler-policy":"binpack,numa","nvidia.com/use-gputype":"A100"}},
      "spec":{"containers":[{"name":"main","resources":{"limits":{"nvidia.com/gpu":"2",
      "nvidia.com/gpumem-percentage":"50"}}},{"name":"side"}]}})"),
                                device::DefaultNvidiaConfig()),
              IsEmpty());
}

}  // namespace
}  // namespace tessera::extender
