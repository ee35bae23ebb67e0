#include "tessera/device/request.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::device {
namespace {

using ::testing::HasSubstr;

kube::Container C(std::string name, kube::ResourceList limits, kube::ResourceList requests = {}) {
  kube::Container c;
  c.name = std::move(name);
  c.limits = std::move(limits);
  c.requests = std::move(requests);
  return c;
}

kube::Pod P(std::vector<kube::Container> app, std::vector<kube::Container> init = {}) {
  kube::Pod p;
  p.meta.ns = "team-a";
  p.meta.name = "trainer";
  p.meta.uid = "uid-1";
  p.containers = std::move(app);
  p.init_containers = std::move(init);
  return p;
}

ContainerRequest R(int32_t nums, int32_t mem, int32_t pct, int32_t cores) {
  ContainerRequest r;
  r.nums = nums;
  r.memreq = mem;
  r.mem_percentage = pct;
  r.coresreq = cores;
  return r;
}

// The request of a one-container pod with these limits.
std::optional<ContainerRequest> One(kube::ResourceList limits,
                                    const NvidiaConfig& config = DefaultNvidiaConfig()) {
  absl::StatusOr<PodRequest> r = DerivePodRequest(P({C("main", std::move(limits))}), config);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok() || r->containers.size() != 1) {
    ADD_FAILURE() << "no single container request";
    return std::nullopt;
  }
  return r->containers[0];
}

// The error of a one-container pod with these limits.
absl::Status OneError(kube::ResourceList limits,
                      const NvidiaConfig& config = DefaultNvidiaConfig()) {
  absl::StatusOr<PodRequest> r = DerivePodRequest(P({C("main", std::move(limits))}), config);
  EXPECT_FALSE(r.ok());
  return r.ok() ? absl::OkStatus() : r.status();
}

TEST(RequestTest, PodWithoutManagedResourcesIsEmpty) {
  absl::StatusOr<PodRequest> r = DerivePodRequest(
      P({C("app", {{"cpu", "500m"}, {"memory", "1Gi"}}), C("sidecar", {})}), DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->Empty());
  ASSERT_EQ(r->containers.size(), 2u);
  EXPECT_FALSE(r->containers[0].has_value());
  EXPECT_FALSE(r->containers[1].has_value());
  EXPECT_EQ(r->init_count, 0u);
  r = DerivePodRequest(P({}), DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->Empty());
  EXPECT_TRUE(r->containers.empty());
}

TEST(RequestTest, CountOnlyBooksTheWholeDevice) {
  std::optional<ContainerRequest> r = One({{"nvidia.com/gpu", "1"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, R(1, 0, 100, 0));
  EXPECT_EQ(r->type, "NVIDIA");
}

TEST(RequestTest, CountZeroOrAbsentAsksForNothingAndReadsNothingElse) {
  EXPECT_EQ(One({{"nvidia.com/gpu", "0"}}), std::nullopt);
  // Without a count, the other resources are not read, malformed or not (HAMi's order).
  EXPECT_EQ(One({{"nvidia.com/gpumem", "4000"}, {"nvidia.com/gpucores", "30"}}), std::nullopt);
  EXPECT_EQ(One({{"nvidia.com/gpu", "0"}, {"nvidia.com/gpumem", "bogus"}}), std::nullopt);
}

TEST(RequestTest, MemoryInMiB) {
  EXPECT_EQ(One({{"nvidia.com/gpu", "2"}, {"nvidia.com/gpumem", "3000"}}),
            R(2, 3000, kPercentageUnset, 0));
  // Quantities with suffixes mean what AsInt64 says: 2k is 2000 MiB, 1Gi is 2^30 MiB.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "2k"}}),
            R(1, 2000, kPercentageUnset, 0));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1Gi"}}),
            R(1, 1073741824, kPercentageUnset, 0));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "2147483647"}}),
            R(1, 2147483647, kPercentageUnset, 0));
  absl::Status s = OneError({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "2Gi"}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("nvidia.com/gpumem: \"2Gi\" is too large: the maximum is "
                                     "2147483647"));
  // An explicit 0 is "no memory", so the whole device is booked.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "0"}}), R(1, 0, 100, 0));
}

TEST(RequestTest, Percentage) {
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "50"}}), R(1, 0, 50, 0));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "100"}}),
            R(1, 0, 100, 0));
  // Above 100 clamps to 100.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "150"}}),
            R(1, 0, 100, 0));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "1e9"}}),
            R(1, 0, 100, 0));
  // 0 or below is unset; with no memory either, the whole device.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "0"}}), R(1, 0, 100, 0));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "-5"}}),
            R(1, 0, 100, 0));
  // Unset percentage with memory given: memory wins, percentage stays unset.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"},
                 {"nvidia.com/gpumem-percentage", "0"},
                 {"nvidia.com/gpumem", "100"}}),
            R(1, 100, kPercentageUnset, 0));
  // Both given: both are kept (fit prefers the MiB).
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"},
                 {"nvidia.com/gpumem-percentage", "25"},
                 {"nvidia.com/gpumem", "100"}}),
            R(1, 100, 25, 0));
}

TEST(RequestTest, Cores) {
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}}), R(1, 0, 100, 30));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "100"}}), R(1, 0, 100, 100));
  NvidiaConfig config = DefaultNvidiaConfig();
  config.default_cores = 20;
  // Absent: the default. Given (even 0): the value.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}}, config), R(1, 0, 100, 20));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "0"}}, config), R(1, 0, 100, 0));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "50"}}, config),
            R(1, 0, 100, 50));
}

TEST(RequestTest, DefaultMemory) {
  NvidiaConfig config = DefaultNvidiaConfig();
  config.default_memory = 1024;
  // Neither memory nor percentage: defaultMemory.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}}, config), R(1, 1024, kPercentageUnset, 0));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "0"}}, config),
            R(1, 1024, kPercentageUnset, 0));
  // A percentage or an explicit memory overrides it.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "40"}}, config),
            R(1, 0, 40, 0));
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "512"}}, config),
            R(1, 512, kPercentageUnset, 0));
  // defaultMemory is MiB as configured; memoryFactor does not scale it.
  config.memory_factor = 4;
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}}, config), R(1, 1024, kPercentageUnset, 0));
}

TEST(RequestTest, MemoryFactor) {
  NvidiaConfig config = DefaultNvidiaConfig();
  config.memory_factor = 1024;
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "3"}}, config),
            R(1, 3072, kPercentageUnset, 0));
  // The largest request whose product fits int32.
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "2097151"}}, config),
            R(1, 2097151 * 1024, kPercentageUnset, 0));
  absl::Status s = OneError({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "2097152"}}, config);
  EXPECT_THAT(s.message(),
              HasSubstr("nvidia.com/gpumem: \"2097152\" is too large: the maximum is 2097151 "
                        "(2147483647 / memoryFactor 1024)"));
  // 0 and 1 both mean no factor.
  config.memory_factor = 0;
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "3"}}, config),
            R(1, 3, kPercentageUnset, 0));
  config.memory_factor = 1;
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "3"}}, config),
            R(1, 3, kPercentageUnset, 0));
}

TEST(RequestTest, LimitsTakePrecedenceOverRequestsPerResource) {
  absl::StatusOr<PodRequest> r =
      DerivePodRequest(P({C("main", {{"nvidia.com/gpu", "2"}, {"nvidia.com/gpucores", "40"}},
                            {{"nvidia.com/gpu", "1"},
                             {"nvidia.com/gpumem", "2000"},
                             {"nvidia.com/gpucores", "10"}})}),
                       DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  // Count and cores from limits; memory only in requests, so from requests.
  EXPECT_EQ(r->containers[0], R(2, 2000, kPercentageUnset, 40));
  // Requests alone are enough.
  r = DerivePodRequest(P({C("main", {}, {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "10"}})}),
                       DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->containers[0], R(1, 10, kPercentageUnset, 0));
  // A malformed request hidden by a valid limit is not read.
  r = DerivePodRequest(P({C("main", {{"nvidia.com/gpu", "1"}}, {{"nvidia.com/gpu", "x"}})}),
                       DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->containers[0], R(1, 0, 100, 0));
}

TEST(RequestTest, MultipleContainers) {
  absl::StatusOr<PodRequest> r = DerivePodRequest(
      P({C("a", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1000"}}), C("b", {{"cpu", "1"}}),
         C("c", {{"nvidia.com/gpu", "2"},
                 {"nvidia.com/gpumem-percentage", "30"},
                 {"nvidia.com/gpucores", "25"}})}),
      DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->containers.size(), 3u);
  EXPECT_EQ(r->containers[0], R(1, 1000, kPercentageUnset, 0));
  EXPECT_EQ(r->containers[1], std::nullopt);
  EXPECT_EQ(r->containers[2], R(2, 0, 30, 25));
  EXPECT_FALSE(r->Empty());
  EXPECT_EQ(r->init_count, 0u);
}

TEST(RequestTest, InitContainersComeFirst) {
  absl::StatusOr<PodRequest> r = DerivePodRequest(
      P({C("app", {}), C("worker", {{"nvidia.com/gpu", "1"}})},
        {C("fetch", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "500"}}), C("wait", {})}),
      DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->init_count, 2u);
  ASSERT_EQ(r->containers.size(), 4u);
  EXPECT_EQ(r->containers[0], R(1, 500, kPercentageUnset, 0));
  EXPECT_EQ(r->containers[1], std::nullopt);
  EXPECT_EQ(r->containers[2], std::nullopt);
  EXPECT_EQ(r->containers[3], R(1, 0, 100, 0));
  // An init container alone makes the pod non-empty.
  r = DerivePodRequest(P({C("app", {})}, {C("fetch", {{"nvidia.com/gpu", "1"}})}),
                       DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->Empty());
}

TEST(RequestTest, ConfiguredResourceNames) {
  NvidiaConfig config = DefaultNvidiaConfig();
  config.resource_count_name = "example.com/vgpu";
  config.resource_memory_name = "example.com/vmem";
  config.resource_memory_percentage_name = "example.com/vpct";
  config.resource_core_name = "example.com/vcores";
  EXPECT_EQ(One({{"nvidia.com/gpu", "1"}}, config), std::nullopt);
  EXPECT_EQ(One({{"example.com/vgpu", "3"},
                 {"example.com/vmem", "100"},
                 {"example.com/vcores", "10"},
                 {"nvidia.com/gpumem", "999"}},
                config),
            R(3, 100, kPercentageUnset, 10));
  EXPECT_EQ(One({{"example.com/vgpu", "1"}, {"example.com/vpct", "20"}}, config), R(1, 0, 20, 0));
}

struct BadValue {
  kube::ResourceList limits;
  std::string message;
};

void PrintTo(const BadValue& b, std::ostream* os) { *os << b.message; }

class BadValueTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(BadValueTest, IsAnErrorNamingPodContainerAndResource) {
  absl::Status s = OneError(GetParam().limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("pod team-a/trainer: container \"main\": "));
  EXPECT_THAT(s.message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Requests, BadValueTest,
    ::testing::Values(
        BadValue{{{"nvidia.com/gpu", "1.5"}}, "nvidia.com/gpu: \"1.5\" is not an integer"},
        BadValue{{{"nvidia.com/gpu", "500m"}}, "nvidia.com/gpu: \"500m\" is not an integer"},
        BadValue{{{"nvidia.com/gpu", "one"}}, "nvidia.com/gpu: invalid quantity \"one\""},
        BadValue{{{"nvidia.com/gpu", "1 "}}, "nvidia.com/gpu: invalid quantity \"1 \""},
        BadValue{{{"nvidia.com/gpu", "-1"}}, "nvidia.com/gpu: \"-1\" is negative"},
        BadValue{{{"nvidia.com/gpu", "3000000000"}}, "nvidia.com/gpu: \"3000000000\" is too large"},
        BadValue{{{"nvidia.com/gpu", "1e30"}}, "nvidia.com/gpu: quantity \"1e30\" is out of range"},
        BadValue{{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1.5"}},
                 "nvidia.com/gpumem: \"1.5\" is not an integer"},
        BadValue{{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "-100"}},
                 "nvidia.com/gpumem: \"-100\" is negative"},
        BadValue{{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "4Gb"}},
                 "nvidia.com/gpumem: invalid quantity \"4Gb\": unknown suffix \"Gb\""},
        BadValue{{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "0.5"}},
                 "nvidia.com/gpumem-percentage: \"0.5\" is not an integer"},
        BadValue{{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "%50"}},
                 "nvidia.com/gpumem-percentage: invalid quantity"},
        BadValue{{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "x"}},
                 "nvidia.com/gpucores: invalid quantity \"x\""},
        BadValue{{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "-1"}},
                 "nvidia.com/gpucores: \"-1\" is negative"},
        BadValue{{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "3Gi"}},
                 "nvidia.com/gpucores: \"3Gi\" is too large"}));

TEST(RequestTest, ErrorsInInitContainersSayInit) {
  absl::StatusOr<PodRequest> r =
      DerivePodRequest(P({C("app", {{"nvidia.com/gpu", "1"}})},
                         {C("setup", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "lots"}})}),
                       DefaultNvidiaConfig());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("pod team-a/trainer: init container \"setup\": nvidia.com/gpucores: "
                        "invalid quantity \"lots\""));
}

TEST(RequestTest, DeriveContainerRequestDirectly) {
  absl::StatusOr<std::optional<ContainerRequest>> r = DeriveContainerRequest(
      C("c", {{"nvidia.com/gpu", "4"}, {"nvidia.com/gpucores", "50"}}), DefaultNvidiaConfig());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, R(4, 0, 100, 50));
  r = DeriveContainerRequest(C("c", {{"nvidia.com/gpu", "x"}}), DefaultNvidiaConfig());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("nvidia.com/gpu: invalid quantity \"x\""));
}

}  // namespace
}  // namespace tessera::device
