// Tests of the node lock, handshake, cordon list and user-annotation codecs. The comment above
// each vector names the HAMi version whose format it follows.
#include "tessera/device/annotations.h"

#include <string>

#include "absl/time/civil_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/device/codec.h"

namespace tessera::device {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

MATCHER_P(ErrorContains, text, "") {
  return !arg.ok() && arg.status().code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.status().message()).find(text) != std::string::npos;
}

absl::Time Utc(int y, int mo, int d, int h, int mi, int s) {
  return absl::FromCivil(absl::CivilSecond(y, mo, d, h, mi, s), absl::UTCTimeZone());
}

// ---- Node lock -------------------------------------------------------------------------------

// docs/hami-protocol.md §2.1.3 (both versions): "<RFC3339>,<ns>,<name>" with a local offset.
TEST(NodeLock, ParsesOwnerAndOffset) {
  auto lock = ParseNodeLock("2025-05-26T10:00:00+08:00,default,gpu-pod");
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_EQ(lock->time, Utc(2025, 5, 26, 2, 0, 0));
  EXPECT_EQ(lock->ns, "default");
  EXPECT_EQ(lock->name, "gpu-pod");
  EXPECT_FALSE(lock->legacy);
  EXPECT_TRUE(NodeLockOwnedBy(*lock, "default", "gpu-pod"));
  EXPECT_FALSE(NodeLockOwnedBy(*lock, "default", "other"));
  EXPECT_FALSE(NodeLockOwnedBy(*lock, "kube-system", "gpu-pod"));
}

TEST(NodeLock, NegativeOffsetAndFraction) {
  // Go's time.Parse accepts a fraction after the seconds even though RFC3339 has none.
  auto lock = ParseNodeLock("2025-12-31T23:30:00.25-01:30,ns,p");
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_EQ(lock->time, Utc(2026, 1, 1, 1, 0, 0) + absl::Milliseconds(250));
}

// docs/hami-protocol.md §2.1.3: the legacy value is a bare time; it has no owner.
TEST(NodeLock, LegacyBareTime) {
  auto lock = ParseNodeLock("2024-02-29T00:00:00Z");
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_TRUE(lock->legacy);
  EXPECT_EQ(lock->time, Utc(2024, 2, 29, 0, 0, 0));
  EXPECT_FALSE(NodeLockOwnedBy(*lock, "", ""));
}

TEST(NodeLock, FormatIsGoRfc3339InUtc) {
  absl::Time t = Utc(2026, 1, 2, 3, 4, 5) + absl::Milliseconds(999);
  EXPECT_EQ(FormatNodeLock(t, "default", "gpu-pod"), "2026-01-02T03:04:05Z,default,gpu-pod");
  auto back = ParseNodeLock(FormatNodeLock(t, "default", "gpu-pod"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->time, Utc(2026, 1, 2, 3, 4, 5));
  EXPECT_TRUE(NodeLockOwnedBy(*back, "default", "gpu-pod"));
}

TEST(NodeLock, Errors) {
  EXPECT_THAT(ParseNodeLock(""), ErrorContains("time is not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-05-26T10:00:00Z,default"),
              ErrorContains("got 2 comma-separated parts"));
  EXPECT_THAT(ParseNodeLock("2025-05-26T10:00:00Z,a,b,c"),
              ErrorContains("got 4 comma-separated parts"));
  EXPECT_THAT(ParseNodeLock("2025-05-26 10:00:00Z,a,b"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-05-26T10:00:00,a,b"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-05-26T10:00:00+0800,a,b"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-02-29T10:00:00Z"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-13-01T10:00:00Z"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-01-01T24:00:00Z"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-01-01T10:00:60Z"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-01-01T10:00:00.Z"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-01-01T10:00:00z"), ErrorContains("not RFC 3339"));
  EXPECT_THAT(ParseNodeLock("2025-01-01T10:00:00Z,,p"), ErrorContains("empty namespace"));
  EXPECT_THAT(ParseNodeLock("2025-01-01T10:00:00Z,ns,"), ErrorContains("empty name"));
}

// ---- Handshake -------------------------------------------------------------------------------

// docs/hami-protocol.md §2.1.2: Requesting_<time.DateTime>, written by every HAMi scheduler.
TEST(Handshake, Requesting) {
  Handshake h = ParseHandshake("Requesting_2024-01-23 04:30:04");
  EXPECT_EQ(h.kind, HandshakeKind::kRequesting);
  EXPECT_EQ(h.time, Utc(2024, 1, 23, 4, 30, 4));
  EXPECT_EQ(FormatHandshakeRequesting(Utc(2024, 1, 23, 4, 30, 4) + absl::Milliseconds(700)),
            "Requesting_2024-01-23 04:30:04");
}

// v2.5.2 panics on a bare "Requesting" (no '_'); Tessera returns the kind without a time.
TEST(Handshake, BareOrBrokenRequestingHasNoTime) {
  EXPECT_EQ(ParseHandshake("Requesting"), (Handshake{HandshakeKind::kRequesting, std::nullopt}));
  EXPECT_EQ(ParseHandshake("Requesting_"), (Handshake{HandshakeKind::kRequesting, std::nullopt}));
  EXPECT_EQ(ParseHandshake("Requesting_2024-01-23T04:30:04Z").time, std::nullopt);
  EXPECT_EQ(ParseHandshake("Requesting_2024-01-23 04:30:04 ").time, std::nullopt);
}

// v2.5.2 … v2.9 schedulers: Deleted_<time.DateTime>.
TEST(Handshake, Deleted) {
  Handshake h = ParseHandshake("Deleted_2025-06-01 12:00:00");
  EXPECT_EQ(h.kind, HandshakeKind::kDeleted);
  EXPECT_EQ(h.time, Utc(2025, 6, 1, 12, 0, 0));
  EXPECT_EQ(FormatHandshakeDeleted(Utc(2025, 6, 1, 12, 0, 0)), "Deleted_2025-06-01 12:00:00");
  EXPECT_EQ(ParseHandshake("Deleted"), (Handshake{HandshakeKind::kDeleted, std::nullopt}));
}

// v2.5.2 plugin: "Reported " + Go time.Now().String(), monotonic reading included.
TEST(Handshake, ReportedFromV252Plugin) {
  Handshake h =
      ParseHandshake("Reported 2024-01-23 04:30:04.434037031 +0000 UTC m=+1104711.777756895");
  EXPECT_EQ(h.kind, HandshakeKind::kReported);
  EXPECT_EQ(h.time, Utc(2024, 1, 23, 4, 30, 4) + absl::Nanoseconds(434037031));
  // Another zone, no fraction, no monotonic part.
  Handshake cst = ParseHandshake("Reported 2024-01-23 12:30:04 +0800 CST");
  EXPECT_EQ(cst.time, Utc(2024, 1, 23, 4, 30, 4));
  EXPECT_EQ(ParseHandshake("Reported garbage"),
            (Handshake{HandshakeKind::kReported, std::nullopt}));
  EXPECT_EQ(ParseHandshake("Reported 2024-01-23 04:30:04 +0000").time, std::nullopt);
  EXPECT_EQ(ParseHandshake("Reported 2024-01-23 04:30:04 +0000 UTC junk").time, std::nullopt);
}

TEST(Handshake, FormatReportedTrimsFractionLikeGo) {
  absl::Time t = Utc(2024, 1, 23, 4, 30, 4);
  EXPECT_EQ(FormatHandshakeReported(t), "Reported 2024-01-23 04:30:04 +0000 UTC");
  EXPECT_EQ(FormatHandshakeReported(t + absl::Milliseconds(120)),
            "Reported 2024-01-23 04:30:04.12 +0000 UTC");
  absl::Time precise = t + absl::Nanoseconds(434037031);
  EXPECT_EQ(ParseHandshake(FormatHandshakeReported(precise)).time, precise);
}

TEST(Handshake, AbsentAndOther) {
  EXPECT_EQ(ParseHandshake(""), (Handshake{HandshakeKind::kAbsent, std::nullopt}));
  EXPECT_EQ(ParseHandshake("hello").kind, HandshakeKind::kOther);
  EXPECT_EQ(ParseHandshake(" Requesting_2024-01-23 04:30:04").kind, HandshakeKind::kOther);
}

// ---- Cordon list (v2.10) -----------------------------------------------------------------------

TEST(CordonList, TrimsSkipsEmptiesSortsAndDedupes) {
  EXPECT_THAT(ParseCordonList(" GPU-b , GPU-a,,GPU-b,\t"), ElementsAre("GPU-a", "GPU-b"));
  EXPECT_THAT(ParseCordonList(""), IsEmpty());
  EXPECT_THAT(ParseCordonList(" , "), IsEmpty());
  NodeDevices node;
  node.cordoned = ParseCordonList("GPU-z,GPU-c");
  EXPECT_TRUE(node.IsCordoned("GPU-c"));
  EXPECT_FALSE(node.IsCordoned("GPU-d"));
}

// ---- Policies (v2.10 §2.4) -------------------------------------------------------------------

TEST(NodePolicyTest, BinpackSpreadAndErrors) {
  EXPECT_EQ(*ParseNodePolicy("binpack"), NodePolicy::kBinpack);
  EXPECT_EQ(*ParseNodePolicy(" spread "), NodePolicy::kSpread);
  // HAMi treats any other value as binpack; Tessera rejects it.
  EXPECT_THAT(ParseNodePolicy("Spread"), ErrorContains("unknown node scheduler policy \"Spread\""));
  EXPECT_THAT(ParseNodePolicy(""), ErrorContains("unknown node scheduler policy"));
}

TEST(GpuPolicyTest, SingleKeysAndChains) {
  using K = GpuPolicyKey;
  EXPECT_EQ(ParseGpuPolicy("binpack")->chain, std::vector<K>{K::kBinpack});
  EXPECT_EQ(ParseGpuPolicy("spread")->chain, std::vector<K>{K::kSpread});
  EXPECT_EQ(ParseGpuPolicy("numa")->chain, std::vector<K>{K::kNuma});
  EXPECT_EQ(ParseGpuPolicy("mutex")->chain, std::vector<K>{K::kMutex});
  EXPECT_EQ(ParseGpuPolicy("binpack,numa")->chain, (std::vector<K>{K::kBinpack, K::kNuma}));
  EXPECT_EQ(ParseGpuPolicy(" numa , spread ,")->chain, (std::vector<K>{K::kNuma, K::kSpread}));
  EXPECT_EQ(ParseGpuPolicy("mutex,binpack")->chain, (std::vector<K>{K::kMutex, K::kBinpack}));
  // HAMi v2.10 pkg/util/util.go, PolicyContains: trimmed comma tokens.
  EXPECT_EQ(ParseGpuPolicy("topology-aware")->chain, std::vector<K>{K::kTopologyAware});
  EXPECT_EQ(ParseGpuPolicy("binpack, topology-aware")->chain,
            (std::vector<K>{K::kBinpack, K::kTopologyAware}));
  EXPECT_EQ(GpuPolicyName(*ParseGpuPolicy(" mutex ,topology-aware")), "mutex,topology-aware");
}

TEST(GpuPolicyTest, Errors) {
  EXPECT_THAT(ParseGpuPolicy("topology-aware,topology-aware"),
              ErrorContains("topology-aware given twice"));
  EXPECT_THAT(ParseGpuPolicy("topology"), ErrorContains("unknown GPU scheduler policy"));
  EXPECT_THAT(ParseGpuPolicy("best"), ErrorContains("unknown GPU scheduler policy \"best\""));
  EXPECT_THAT(ParseGpuPolicy("numa,numa"), ErrorContains("numa given twice"));
  EXPECT_THAT(ParseGpuPolicy("binpack,spread"), ErrorContains("contradict"));
  EXPECT_THAT(ParseGpuPolicy("spread,numa,binpack"), ErrorContains("contradict"));
  EXPECT_THAT(ParseGpuPolicy(" , "), ErrorContains("no policy given"));
}

// ---- Pod constraints (v2.10 §2.4) --------------------------------------------------------------

TEST(PodConstraintsTest, NoAnnotationsNoConstraints) {
  auto c = ParsePodConstraints(kube::StringMap{});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, PodConstraints{});
}

TEST(PodConstraintsTest, ListsAreTrimmedAndEmptiesDropped) {
  kube::StringMap a{{std::string(kUseGpuTypeAnnotation), "A100, V100,,"},
                    {std::string(kNoUseGpuTypeAnnotation), ""},
                    {std::string(kUseGpuUuidAnnotation), " GPU-1 ,GPU-2"},
                    {std::string(kNoUseGpuUuidAnnotation), "GPU-3"},
                    {"unrelated/annotation", "x"}};
  auto c = ParsePodConstraints(a);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->use_types, ElementsAre("A100", "V100"));
  // v2.5.2 rejected every device for an empty nouse-gputype; v2.10 and Tessera: no constraint.
  EXPECT_THAT(c->nouse_types, IsEmpty());
  // v2.10: use- and nouse-gpuuuid both apply.
  EXPECT_THAT(c->use_uuids, ElementsAre("GPU-1", "GPU-2"));
  EXPECT_THAT(c->nouse_uuids, ElementsAre("GPU-3"));
  EXPECT_FALSE(c->vgpu_mode.has_value());
  EXPECT_FALSE(c->numa_bind);
}

TEST(PodConstraintsTest, ModeNumaAndPolicies) {
  kube::StringMap a{{std::string(kVgpuModeAnnotation), " hami-core,mig "},
                    {std::string(kNumaBindAnnotation), "T"},
                    {std::string(kNodeSchedulerPolicyAnnotation), "spread"},
                    {std::string(kGpuSchedulerPolicyAnnotation), "binpack,numa"}};
  auto c = ParsePodConstraints(a);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vgpu_mode, "hami-core,mig");
  EXPECT_TRUE(c->numa_bind);
  EXPECT_EQ(c->node_policy, NodePolicy::kSpread);
  EXPECT_EQ(c->gpu_policy, (GpuPolicy{{GpuPolicyKey::kBinpack, GpuPolicyKey::kNuma}}));
}

TEST(PodConstraintsTest, EmptyModeAndPoliciesCountAsAbsent) {
  kube::StringMap a{{std::string(kVgpuModeAnnotation), " "},
                    {std::string(kNodeSchedulerPolicyAnnotation), ""},
                    {std::string(kGpuSchedulerPolicyAnnotation), "  "}};
  auto c = ParsePodConstraints(a);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->vgpu_mode.has_value());
  EXPECT_FALSE(c->node_policy.has_value());
  EXPECT_FALSE(c->gpu_policy.has_value());
}

TEST(PodConstraintsTest, NumaBindIsGoParseBool) {
  for (const char* yes : {"1", "t", "T", "TRUE", "true", "True"}) {
    auto c = ParsePodConstraints(kube::StringMap{{std::string(kNumaBindAnnotation), yes}});
    ASSERT_TRUE(c.ok()) << yes;
    EXPECT_TRUE(c->numa_bind) << yes;
  }
  for (const char* no : {"0", "f", "F", "FALSE", "false", "False"}) {
    auto c = ParsePodConstraints(kube::StringMap{{std::string(kNumaBindAnnotation), no}});
    ASSERT_TRUE(c.ok()) << no;
    EXPECT_FALSE(c->numa_bind) << no;
  }
  for (const char* bad : {"", "yes", "tRUE", " true", "2"}) {
    EXPECT_THAT(ParsePodConstraints(kube::StringMap{{std::string(kNumaBindAnnotation), bad}}),
                ErrorContains("nvidia.com/numa-bind: not a boolean"))
        << bad;
  }
}

TEST(PodConstraintsTest, PolicyErrorsNameTheAnnotation) {
  EXPECT_THAT(
      ParsePodConstraints(kube::StringMap{{std::string(kNodeSchedulerPolicyAnnotation), "pack"}}),
      ErrorContains("hami.io/node-scheduler-policy: unknown node scheduler policy \"pack\""));
  EXPECT_THAT(ParsePodConstraints(
                  kube::StringMap{{std::string(kGpuSchedulerPolicyAnnotation), "topology"}}),
              ErrorContains("hami.io/gpu-scheduler-policy: unknown GPU scheduler policy "
                            "\"topology\""));
}

TEST(AnnotationKeys, ExactStrings) {
  EXPECT_EQ(kNodeRegisterAnnotation, "hami.io/node-nvidia-register");
  EXPECT_EQ(kNodeHandshakeAnnotation, "hami.io/node-handshake");
  EXPECT_EQ(kNodeLockAnnotation, "hami.io/mutex.lock");
  EXPECT_EQ(kDeviceCordonAnnotation, "hami.io/device-cordon");
  EXPECT_EQ(kVgpuNodeAnnotation, "hami.io/vgpu-node");
  EXPECT_EQ(kVgpuNodeLabel, "hami.io/vgpu-node");
  EXPECT_EQ(kVgpuTimeAnnotation, "hami.io/vgpu-time");
  EXPECT_EQ(kDevicesToAllocateAnnotation, "hami.io/vgpu-devices-to-allocate");
  EXPECT_EQ(kDevicesAllocatedAnnotation, "hami.io/vgpu-devices-allocated");
  EXPECT_EQ(kBindPhaseAnnotation, "hami.io/bind-phase");
  EXPECT_EQ(kBindTimeAnnotation, "hami.io/bind-time");
  EXPECT_EQ(kUseGpuTypeAnnotation, "nvidia.com/use-gputype");
  EXPECT_EQ(kNoUseGpuTypeAnnotation, "nvidia.com/nouse-gputype");
  EXPECT_EQ(kUseGpuUuidAnnotation, "nvidia.com/use-gpuuuid");
  EXPECT_EQ(kNoUseGpuUuidAnnotation, "nvidia.com/nouse-gpuuuid");
  EXPECT_EQ(kVgpuModeAnnotation, "nvidia.com/vgpu-mode");
  EXPECT_EQ(kNumaBindAnnotation, "nvidia.com/numa-bind");
  EXPECT_EQ(kNodeSchedulerPolicyAnnotation, "hami.io/node-scheduler-policy");
  EXPECT_EQ(kGpuSchedulerPolicyAnnotation, "hami.io/gpu-scheduler-policy");
}

}  // namespace
}  // namespace tessera::device
