#include "tessera/device/device_config.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <string>
#include <string_view>

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::device {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The nvidia section of a parsed document (most tests here are about it).
absl::StatusOr<NvidiaConfig> ParseNvidia(std::string_view yaml) {
  absl::StatusOr<DeviceConfig> config = ParseDeviceConfig(yaml);
  if (!config.ok()) {
    return config.status();
  }
  return config->nvidia;
}

absl::StatusOr<NvidiaConfig> LoadNvidia(const std::string& path) {
  absl::StatusOr<DeviceConfig> config = LoadDeviceConfigFile(path);
  if (!config.ok()) {
    return config.status();
  }
  return config->nvidia;
}

std::string SourceDir() {
  const char* dir = std::getenv("TESSERA_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

TEST(DeviceConfigTest, DefaultsAreTheChartDefaults) {
  NvidiaConfig c = DefaultNvidiaConfig();
  EXPECT_EQ(c.resource_count_name, "nvidia.com/gpu");
  EXPECT_EQ(c.resource_memory_name, "nvidia.com/gpumem");
  EXPECT_EQ(c.resource_memory_percentage_name, "nvidia.com/gpumem-percentage");
  EXPECT_EQ(c.resource_core_name, "nvidia.com/gpucores");
  EXPECT_EQ(c.resource_priority_name, "nvidia.com/priority");
  EXPECT_FALSE(c.overwrite_env);
  EXPECT_EQ(c.default_memory, 0);
  EXPECT_EQ(c.default_cores, 0);
  EXPECT_EQ(c.default_gpu_num, 1);
  EXPECT_EQ(c.memory_factor, 1);
  EXPECT_EQ(c.device_split_count, 10);
  EXPECT_EQ(c.device_memory_scaling, 1.0);
  EXPECT_EQ(c.device_core_scaling, 1.0);
  EXPECT_EQ(c.gpu_core_policy, GpuCorePolicy::kDefault);
  EXPECT_EQ(c.runtime_class_name, "");
}

TEST(DeviceConfigTest, ExampleFileIsTheChartDefaults) {
  absl::StatusOr<NvidiaConfig> c = LoadNvidia(SourceDir() + "/examples/device-config.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  // v2.5.2's chart geometries for A30, A100-40GB and A100-80GB.
  ASSERT_EQ(c->known_mig_geometries.size(), 3U);
  EXPECT_EQ(c->known_mig_geometries[1].models.front(), "A100-SXM4-40GB");
  EXPECT_EQ(c->known_mig_geometries[1].geometries.size(), 4U);
  EXPECT_EQ(c->known_mig_geometries[1].geometries[2],
            (std::vector<MigTemplate>{{"3g.20gb", 0, 20480, 2}}));
  NvidiaConfig rest = *c;
  rest.known_mig_geometries.clear();
  EXPECT_EQ(rest, DefaultNvidiaConfig());
}

TEST(DeviceConfigTest, ParsesEveryKey) {
  absl::StatusOr<NvidiaConfig> c = ParseNvidia(R"(
nvidia:
  resourceCountName: example.com/vgpu
  resourceMemoryName: example.com/vmem
  resourceMemoryPercentageName: example.com/vmem-pct
  resourceCoreName: example.com/vcores
  resourcePriorityName: example.com/prio
  overwriteEnv: true
  defaultMemory: 2048
  defaultCores: 30
  defaultGPUNum: 2
  memoryFactor: 1024
  deviceSplitCount: 4
  deviceMemoryScaling: 1.5
  deviceCoreScaling: 2
  gpuCorePolicy: force
  runtimeClassName: nvidia
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->resource_count_name, "example.com/vgpu");
  EXPECT_EQ(c->resource_memory_name, "example.com/vmem");
  EXPECT_EQ(c->resource_memory_percentage_name, "example.com/vmem-pct");
  EXPECT_EQ(c->resource_core_name, "example.com/vcores");
  EXPECT_EQ(c->resource_priority_name, "example.com/prio");
  EXPECT_TRUE(c->overwrite_env);
  EXPECT_EQ(c->default_memory, 2048);
  EXPECT_EQ(c->default_cores, 30);
  EXPECT_EQ(c->default_gpu_num, 2);
  EXPECT_EQ(c->memory_factor, 1024);
  EXPECT_EQ(c->device_split_count, 4);
  EXPECT_EQ(c->device_memory_scaling, 1.5);
  EXPECT_EQ(c->device_core_scaling, 2.0);
  EXPECT_EQ(c->gpu_core_policy, GpuCorePolicy::kForce);
  EXPECT_EQ(c->runtime_class_name, "nvidia");
}

TEST(DeviceConfigTest, AbsentAndNullKeysKeepTheDefaults) {
  absl::StatusOr<NvidiaConfig> c =
      ParseNvidia("nvidia:\n  defaultMemory: 1024\n  resourceCountName: ~\n  defaultCores:\n");
  ASSERT_TRUE(c.ok()) << c.status();
  NvidiaConfig want = DefaultNvidiaConfig();
  want.default_memory = 1024;
  EXPECT_EQ(*c, want);
}

TEST(DeviceConfigTest, OtherVendorsAndUnknownKeysAreIgnored) {
  absl::StatusOr<NvidiaConfig> c = ParseNvidia(R"(
nvidia:
  defaultCores: 10
  knownMigGeometries:
    - models: ["A30"]
      allowedGeometries: [[{name: 1g.6gb, memory: 6144, count: 4}]]
  disableCoreLimit: true
  someFutureKey: {a: 1}
cambricon:
  resourceCountName: cambricon.com/vmlu
mthreads:
  - chipName: MTT S4000
somethingElse: 3
)");
  ASSERT_TRUE(c.ok()) << c.status();
  NvidiaConfig want = DefaultNvidiaConfig();
  want.default_cores = 10;
  want.known_mig_geometries = {{{"A30"}, {{{"1g.6gb", 0, 6144, 4}}}}};
  EXPECT_EQ(*c, want);
}

// HAMi v2.10 chart (templates/scheduler/device-configmap.yaml), two of its entries.
TEST(DeviceConfigTest, MigProfileAllowlist) {
  absl::StatusOr<NvidiaConfig> c = ParseNvidia(R"(
nvidia:
  migProfileAllowlist:
  - models: ["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"]
    profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
  - models: ["H200 NVL", "H200-SXM5"]
    profiles: ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]
)");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->mig_profile_allowlist.size(), 2U);
  EXPECT_EQ(c->mig_profile_allowlist[1].profiles.back(), "7g.141gb");
  const MigAllowlistEntry* a100 = FindMigAllowlist(*c, "NVIDIA A100-PCIE-40GB");
  ASSERT_NE(a100, nullptr);
  EXPECT_EQ(a100->profiles.front(), "1g.5gb");
  EXPECT_EQ(FindMigAllowlist(*c, "NVIDIA H200 NVL"), &c->mig_profile_allowlist[1]);
  EXPECT_EQ(FindMigAllowlist(*c, "NVIDIA H100 80GB HBM3"), nullptr);
  EXPECT_EQ(FindMigGeometries(*c, "NVIDIA A100-PCIE-40GB"), nullptr);
}

// v2.10 mig_profiles.go:ValidateMigProfileAllowlist is fatal in HAMi; here the config is rejected.
TEST(DeviceConfigTest, BadMigKeysAreRejectedNamingTheEntry) {
  const std::pair<const char*, const char*> kBad[] = {
      {"nvidia: {migProfileAllowlist: [{models: [A100]}]}",
       "nvidia.migProfileAllowlist[0]: MIG profile allowlist must define models and profiles"},
      {"nvidia: {migProfileAllowlist: [{models: [], profiles: [1g.5gb]}]}",
       "must define models and profiles"},
      {"nvidia: {migProfileAllowlist: [{models: [A100], profiles: [1g.5gb, g.5gb]}]}",
       "nvidia.migProfileAllowlist[0]: invalid MIG profile \"g.5gb\""},
      {"nvidia: {migProfileAllowlist: {models: [A100]}}",
       "nvidia.migProfileAllowlist: not a sequence"},
      {"nvidia: {migProfileAllowlist: [{models: [[x]], profiles: [1g.5gb]}]}",
       "nvidia.migProfileAllowlist[0].models[0]: not a string"},
      {"nvidia: {knownMigGeometries: [{models: [A30], allowedGeometries: [[{count: x}]]}]}",
       "nvidia.knownMigGeometries[0].allowedGeometries[0][0].count: not an integer"},
      {"nvidia: {knownMigGeometries: [{models: [A30], allowedGeometries: [[{memory: -1}]]}]}",
       "must not be negative"},
  };
  for (const auto& [yaml, want] : kBad) {
    absl::StatusOr<NvidiaConfig> c = ParseNvidia(yaml);
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(want)) << yaml;
  }
}

TEST(DeviceConfigTest, AnotherVendorAloneIsEnoughAndNvidiaTakesDefaults) {
  absl::StatusOr<NvidiaConfig> c = ParseNvidia("hygon:\n  resourceCountName: hygon.com/dcunum\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, DefaultNvidiaConfig());
}

TEST(DeviceConfigTest, ScalarSpellings) {
  absl::StatusOr<NvidiaConfig> c = ParseNvidia(
      "nvidia:\n  overwriteEnv: yes\n  defaultMemory: +12\n  defaultCores: !!int 7\n"
      "  deviceMemoryScaling: 3\n  deviceCoreScaling: .5\n  gpuCorePolicy: disable\n"
      "  resourceCountName: \"quoted.example/gpu\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->overwrite_env);
  EXPECT_EQ(c->default_memory, 12);
  EXPECT_EQ(c->default_cores, 7);
  EXPECT_EQ(c->device_memory_scaling, 3.0);
  EXPECT_EQ(c->device_core_scaling, 0.5);
  EXPECT_EQ(c->gpu_core_policy, GpuCorePolicy::kDisable);
  EXPECT_EQ(c->resource_count_name, "quoted.example/gpu");
  for (const char* spelling : {"true", "True", "TRUE", "on", "On", "Yes"}) {
    c = ParseNvidia(std::string("nvidia:\n  overwriteEnv: ") + spelling + "\n");
    ASSERT_TRUE(c.ok()) << spelling << ": " << c.status();
    EXPECT_TRUE(c->overwrite_env) << spelling;
  }
  c = ParseNvidia("nvidia:\n  defaultMemory: 1\n  overwriteEnv: Off\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->overwrite_env);
  c = ParseNvidia("nvidia:\n  gpuCorePolicy: \"\"\n  defaultMemory: 1\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_core_policy, GpuCorePolicy::kDefault);
}

struct Bad {
  std::string yaml;
  std::string message;  // a substring of the error
};

void PrintTo(const Bad& b, std::ostream* os) { *os << b.message; }

class BadConfigTest : public ::testing::TestWithParam<Bad> {};

TEST_P(BadConfigTest, IsRejectedNamingTheKey) {
  absl::StatusOr<NvidiaConfig> c = ParseNvidia(GetParam().yaml);
  ASSERT_FALSE(c.ok()) << GetParam().yaml;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Configs, BadConfigTest,
    ::testing::Values(
        // Wrong types.
        Bad{"nvidia:\n  defaultMemory: x\n", "nvidia.defaultMemory: not an integer: \"x\""},
        Bad{"nvidia:\n  defaultMemory: \"5\"\n", "nvidia.defaultMemory: not an integer: \"5\""},
        Bad{"nvidia:\n  defaultMemory: 1.5\n", "nvidia.defaultMemory: not an integer: \"1.5\""},
        Bad{"nvidia:\n  defaultMemory: 0x10\n", "nvidia.defaultMemory: not an integer"},
        Bad{"nvidia:\n  defaultMemory: +-5\n", "nvidia.defaultMemory: not an integer"},
        Bad{"nvidia:\n  defaultMemory: 1Gi\n", "nvidia.defaultMemory: not an integer"},
        Bad{"nvidia:\n  defaultCores: [1]\n",
            "nvidia.defaultCores: not an integer: got a sequence"},
        Bad{"nvidia:\n  memoryFactor: {a: 1}\n",
            "nvidia.memoryFactor: not an integer: got a mapping"},
        Bad{"nvidia:\n  overwriteEnv: maybe\n", "nvidia.overwriteEnv: not a boolean: \"maybe\""},
        Bad{"nvidia:\n  overwriteEnv: \"true\"\n", "nvidia.overwriteEnv: not a boolean"},
        Bad{"nvidia:\n  overwriteEnv: 1\n", "nvidia.overwriteEnv: not a boolean"},
        Bad{"nvidia:\n  deviceMemoryScaling: abc\n",
            "nvidia.deviceMemoryScaling: not a finite number: \"abc\""},
        Bad{"nvidia:\n  deviceCoreScaling: .nan\n", "nvidia.deviceCoreScaling: not a finite"},
        Bad{"nvidia:\n  deviceCoreScaling: 1e999\n", "nvidia.deviceCoreScaling: not a finite"},
        Bad{"nvidia:\n  resourceCountName: [a]\n",
            "nvidia.resourceCountName: not a string: got a sequence"},
        Bad{"nvidia:\n  runtimeClassName: {a: b}\n", "nvidia.runtimeClassName: not a string"},
        // Negative and out-of-range values.
        Bad{"nvidia:\n  defaultMemory: -1\n", "nvidia.defaultMemory: must not be negative: -1"},
        Bad{"nvidia:\n  defaultGPUNum: -2\n", "nvidia.defaultGPUNum: must not be negative"},
        Bad{"nvidia:\n  memoryFactor: -1\n", "nvidia.memoryFactor: must not be negative"},
        Bad{"nvidia:\n  deviceSplitCount: -10\n", "nvidia.deviceSplitCount: must not be negative"},
        Bad{"nvidia:\n  deviceMemoryScaling: -0.5\n",
            "nvidia.deviceMemoryScaling: must not be negative"},
        Bad{"nvidia:\n  defaultMemory: 2147483648\n", "nvidia.defaultMemory: out of range"},
        Bad{"nvidia:\n  defaultMemory: 99999999999999999999999\n",
            "nvidia.defaultMemory: out of range"},
        // Bad values.
        Bad{"nvidia:\n  gpuCorePolicy: sometimes\n",
            "nvidia.gpuCorePolicy: unknown policy \"sometimes\""},
        Bad{"nvidia:\n  resourceCountName: \"\"\n", "nvidia.resourceCountName: must not be empty"},
        Bad{"nvidia:\n  resourceMemoryName: \"nvidia.com/ gpumem\"\n",
            "nvidia.resourceMemoryName: resource name contains whitespace"},
        // Structure.
        Bad{"nvidia:\n  defaultMemory: 1\n  defaultMemory: 2\n",
            "nvidia: duplicate key \"defaultMemory\""},
        Bad{"nvidia:\n  defaultMemory: 1\nnvidia:\n  defaultCores: 1\n",
            "device config: duplicate key \"nvidia\""},
        Bad{"nvidia: [1, 2]\n", "nvidia: not a mapping: got a sequence"},
        Bad{"nvidia: 5\n", "nvidia: not a mapping: got a scalar"},
        Bad{"nvidia:\n  ? [a]\n  : 1\n", "nvidia: a key is a sequence, not a scalar"},
        Bad{"- nvidia\n", "device config: the top level is a sequence, not a mapping"},
        Bad{"hello\n", "device config: the top level is a scalar, not a mapping"},
        // Syntax.
        Bad{"nvidia: [1, 2\n", "device config: invalid YAML at line"},
        Bad{"nvidia:\n  a: b\n c: d\n", "device config: invalid YAML at line 3"},
        // Every section empty.
        Bad{"", "every vendor section is empty"}, Bad{"# only a comment\n", "every vendor"},
        Bad{"nvidia:\n", "every vendor section is empty"},
        Bad{"nvidia: {}\n", "every vendor section is empty"},
        Bad{"nvidia:\n  defaultMemory: 0\n  overwriteEnv: false\n  resourceCountName:\n",
            "every vendor section is empty"},
        Bad{"cambricon: {}\nhygon:\nmetax: {resourceCountName: \"\"}\n",
            "every vendor section is empty"},
        Bad{"notAVendor:\n  resourceCountName: x\n", "every vendor section is empty"}));

TEST(DeviceConfigTest, GpuCorePolicyNames) {
  EXPECT_EQ(GpuCorePolicyName(GpuCorePolicy::kDefault), "default");
  EXPECT_EQ(GpuCorePolicyName(GpuCorePolicy::kForce), "force");
  EXPECT_EQ(GpuCorePolicyName(GpuCorePolicy::kDisable), "disable");
}

TEST(DeviceConfigTest, MissingFileIsNotFoundNamingThePath) {
  absl::StatusOr<NvidiaConfig> c = LoadNvidia("/nonexistent/tessera/device.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/tessera/device.yaml"));
}

TEST(DeviceConfigTest, FileParseErrorsArePrefixedWithThePath) {
  std::string path = ::testing::TempDir() + "/device-config-" + std::to_string(getpid()) + ".yaml";
  {
    std::ofstream out(path);
    out << "nvidia:\n  defaultCores: lots\n";
  }
  absl::StatusOr<NvidiaConfig> c = LoadNvidia(path);
  std::remove(path.c_str());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), StartsWith(path + ": "));
  EXPECT_THAT(c.status().message(), HasSubstr("nvidia.defaultCores: not an integer: \"lots\""));
}

TEST(DeviceConfigTest, AliasBombIsBounded) {
  // Aliases make this a tree of 10^9 leaves; the emptiness check must not walk all of them.
  std::string yaml = "a0: &a0 {x: 0}\n";
  for (int i = 1; i <= 9; ++i) {
    yaml += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " {";
    for (int j = 0; j < 10; ++j) {
      yaml += (j > 0 ? ", " : "") + std::string("k") + std::to_string(j) + ": *a" +
              std::to_string(i - 1);
    }
    yaml += "}\n";
  }
  yaml += "cambricon: *a9\n";
  absl::StatusOr<NvidiaConfig> c = ParseNvidia(yaml);
  // The walk gives up after a bounded number of nodes and counts the section as non-empty.
  EXPECT_TRUE(c.ok()) << c.status();
}

}  // namespace
}  // namespace tessera::device

namespace tessera::device {
namespace {

// The vnpus section as HAMi v2.10.0's chart renders it (two of its seven chips; values from
// charts/hami/templates/scheduler/device-configmap.yaml, templates deliberately out of order).
constexpr std::string_view kVnpusV210 = R"(
vnpus:
  hamiVnpuCore: true
  configs:
  - chipName: 910B3
    commonWord: Ascend910B3
    resourceName: huawei.com/Ascend910B3
    resourceMemoryName: huawei.com/Ascend910B3-memory
    resourceCoreName: huawei.com/Ascend910B3-core
    memoryAllocatable: 65536
    memoryCapacity: 65536
    memoryFactor: 1
    aiCore: 20
    aiCPU: 7
    runtimeClassName: ""
    overwriteEnv: false
    templates:
      - name: vir10_3c_32g
        memory: 32768
        aiCore: 10
        aiCPU: 3
      - name: vir05_1c_16g
        memory: 16384
        aiCore: 5
        aiCPU: 1
  - chipName: Ascend910
    commonWord: Ascend910C
    resourceName: huawei.com/Ascend910C
    resourceMemoryName: huawei.com/Ascend910C-memory
    resourceCoreName: huawei.com/Ascend910C-core
    memoryAllocatable: 65536
    memoryCapacity: 65536
    aiCore: 20
    runtimeClassName: "ascend"
    overwriteEnv: true
    superPod: true
    templates:
      - name: vir05_1c_16g
        memory: 16384
)";

TEST(AscendConfigTest, ParsesTheV210SectionWithTemplatesSortedByMemory) {
  absl::StatusOr<DeviceConfig> c = ParseDeviceConfig(kVnpusV210);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nvidia, DefaultNvidiaConfig());
  EXPECT_TRUE(c->ascend.hami_vnpu_core);
  ASSERT_EQ(c->ascend.chips.size(), 2U);
  const AscendChipConfig& b3 = c->ascend.chips[0];
  EXPECT_EQ(b3.common_word, "Ascend910B3");
  EXPECT_EQ(b3.chip_name, "910B3");
  EXPECT_EQ(b3.resource_name, "huawei.com/Ascend910B3");
  EXPECT_EQ(b3.resource_memory_name, "huawei.com/Ascend910B3-memory");
  EXPECT_EQ(b3.resource_core_name, "huawei.com/Ascend910B3-core");
  EXPECT_EQ(b3.memory_allocatable, 65536);
  EXPECT_EQ(b3.memory_capacity, 65536);
  EXPECT_EQ(b3.memory_factor, 1);
  EXPECT_EQ(b3.ai_core, 20);
  EXPECT_EQ(b3.ai_cpu, 7);
  EXPECT_FALSE(b3.super_pod);
  EXPECT_EQ(b3.templates, (std::vector<AscendTemplate>{{"vir05_1c_16g", 16384, 5, 1},
                                                       {"vir10_3c_32g", 32768, 10, 3}}));
  const AscendChipConfig& c910 = c->ascend.chips[1];
  EXPECT_EQ(c910.common_word, "Ascend910C");
  EXPECT_TRUE(c910.super_pod);
  EXPECT_TRUE(c910.overwrite_env);
  EXPECT_EQ(c910.runtime_class_name, "ascend");
  EXPECT_EQ(c910.memory_factor, 0);
}

TEST(AscendConfigTest, AcceptsTheV25ListForm) {
  absl::StatusOr<DeviceConfig> c = ParseDeviceConfig(R"(
vnpus:
- chipName: 910B
  commonWord: Ascend910A
  resourceName: huawei.com/Ascend910A
  resourceMemoryName: huawei.com/Ascend910A-memory
  memoryAllocatable: 32768
  memoryCapacity: 32768
  aiCore: 30
  templates:
    - name: vir02
      memory: 2184
      aiCore: 2
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->ascend.hami_vnpu_core);
  ASSERT_EQ(c->ascend.chips.size(), 1U);
  EXPECT_EQ(c->ascend.chips[0].common_word, "Ascend910A");
  EXPECT_EQ(c->ascend.chips[0].resource_core_name, "");
  EXPECT_EQ(c->ascend.chips[0].templates.size(), 1U);
}

TEST(AscendConfigTest, WithoutTheSectionThereIsNoChip) {
  absl::StatusOr<DeviceConfig> c = ParseDeviceConfig("nvidia:\n  defaultMemory: 1\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ascend, AscendConfig{});
  EXPECT_EQ(DefaultDeviceConfig().ascend, AscendConfig{});
}

TEST(AscendConfigTest, OnlyConfigsMakeTheSectionNonEmptyAsInHami) {
  absl::StatusOr<DeviceConfig> c = ParseDeviceConfig("vnpus:\n  hamiVnpuCore: true\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "device config: every vendor section is empty");
}

struct BadAscend {
  std::string yaml;
  std::string error;
};

class AscendConfigErrorTest : public ::testing::TestWithParam<BadAscend> {};

TEST_P(AscendConfigErrorTest, IsRejectedWithItsPath) {
  absl::StatusOr<DeviceConfig> c = ParseDeviceConfig(GetParam().yaml);
  ASSERT_FALSE(c.ok()) << GetParam().yaml;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), GetParam().error);
}

constexpr std::string_view kChip =
    "  - commonWord: Ascend910B3\n"
    "    resourceName: huawei.com/Ascend910B3\n"
    "    resourceMemoryName: huawei.com/Ascend910B3-memory\n";

INSTANTIATE_TEST_SUITE_P(
    Cases, AscendConfigErrorTest,
    ::testing::Values(
        BadAscend{"vnpus: 3\n", "vnpus: not a mapping: got a scalar"},
        BadAscend{"vnpus:\n  configs: {}\n", "vnpus.configs: not a sequence: got a mapping"},
        BadAscend{"vnpus:\n  configs:\n  - resourceName: a/b\n    resourceMemoryName: a/c\n",
                  "vnpus.configs[0].commonWord: required"},
        BadAscend{"vnpus:\n  configs:\n  - commonWord: \"bad word\"\n",
                  "vnpus.configs[0].commonWord: \"bad word\" cannot be part of an annotation key "
                  "(at most 40 of [A-Za-z0-9._-], alphanumeric at both ends)"},
        BadAscend{"vnpus:\n  configs:\n  - commonWord: Ascend910B3\n    resourceName: a/b\n",
                  "vnpus.configs[0].resourceMemoryName: required"},
        BadAscend{"vnpus:\n  configs:\n" + std::string(kChip) + std::string(kChip),
                  "vnpus.configs[1].commonWord: duplicate \"Ascend910B3\""},
        BadAscend{
            "vnpus:\n  configs:\n" + std::string(kChip) + "    memoryAllocatable: \"65536\"\n",
            "vnpus.configs[0].memoryAllocatable: not an integer: \"65536\""},
        BadAscend{"vnpus:\n  configs:\n" + std::string(kChip) + "    superPod: maybe\n",
                  "vnpus.configs[0].superPod: not a boolean: \"maybe\""},
        BadAscend{"vnpus:\n  configs:\n" + std::string(kChip) +
                      "    templates:\n    - name: t\n      memory: -1\n",
                  "vnpus.configs[0].templates[0].memory: must not be negative: -1"},
        BadAscend{"vnpus:\n  configs:\n  - commonWord: A\n    resourceName: nvidia.com/gpu\n"
                  "    resourceMemoryName: a/m\n",
                  "device config: resource name \"nvidia.com/gpu\" is both an nvidia and a vnpus "
                  "(A) resource"},
        BadAscend{"vnpus:\n  configs:\n  - commonWord: A\n    resourceName: a/n\n"
                  "    resourceMemoryName: a/n\n",
                  "vnpus.configs[0]: resource name \"a/n\" is used twice"}));

}  // namespace
}  // namespace tessera::device
