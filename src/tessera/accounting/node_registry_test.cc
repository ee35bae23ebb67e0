// NodeRegistry and NodeSelector, with explicit times: both register formats, the v2.5–v2.7
// handshake cycle, JSON liveness, cordons, the label selector, node deletion and malformed
// registrations.
#include "tessera/accounting/node_registry.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/device/codec.h"
#include "tessera/device/vendor.h"
#include "tessera/ledger/ledger.h"

namespace tessera::accounting {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kDelimited[] =
    "GPU-a,10,7680,100,NVIDIA-Tesla P4,0,true,0,hami-core:"
    "GPU-b,10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:";
constexpr char kJson[] =
    R"([{"id":"GPU-x","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100","health":true},)"
    R"({"id":"GPU-y","index":1,"count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100",)"
    R"("health":true}])";
constexpr char kHs[] = "hami.io/node-handshake";

const absl::Time kT0 = absl::FromUnixSeconds(1800000000);  // 2027-01-15 08:00:00 UTC

kube::Node MakeNode(const std::string& name, const std::string& reg, const std::string& rv) {
  kube::Node n;
  n.meta.name = name;
  n.meta.uid = "uid-" + name;
  n.meta.resource_version = rv;
  if (!reg.empty()) {
    n.meta.annotations.Set("hami.io/node-nvidia-register", reg);
  }
  n.ready = kube::ConditionStatus::kTrue;
  n.allocatable.Set("nvidia.com/gpu", "20");
  return n;
}

kube::Node Delimited(const std::string& rv, const std::string& handshake) {
  kube::Node n = MakeNode("g1", kDelimited, rv);
  n.meta.annotations.Set(kHs, handshake);
  return n;
}

std::string Reported(absl::Time t) { return device::FormatHandshakeReported(t); }

class RegistryTest : public ::testing::Test {
 protected:
  void Make(NodeRegistry::Options options = {}) {
    registry_ = std::make_unique<NodeRegistry>(vendor_.get(), &ledger_, std::move(options));
  }
  void SetUp() override { Make(); }

  // The devices the ledger has for `node` (nullopt: not registered).
  std::optional<device::NodeSnapshot> Snap(const std::string& node) {
    return ledger_.Snapshot({node})[0];
  }
  // Health of each device as the ledger has it.
  std::vector<bool> Health(const std::string& node) {
    std::vector<bool> out;
    std::optional<device::NodeSnapshot> s = Snap(node);
    if (s.has_value()) {
      for (const device::DeviceInfo& d : s->devices->devices) {
        out.push_back(d.health);
      }
    }
    return out;
  }
  NodeStatus St(const std::string& node) {
    std::optional<NodeStatus> s = registry_->Find(node);
    EXPECT_TRUE(s.has_value()) << node;
    return s.value_or(NodeStatus{});
  }
  // A pod bound to `node` holding 2048 MiB of `uuid`.
  void Bind(const std::string& uid, const std::string& node, const std::string& uuid) {
    ledger::PodAllocation p;
    p.uid = uid;
    p.ns = "ml";
    p.name = uid;
    p.node = node;
    p.bound_node = node;
    p.devices = {{device::ContainerDevice{uuid, "NVIDIA", 2048, 30}}};
    ASSERT_TRUE(ledger_.Apply(p).ok());
  }

  std::unique_ptr<device::Vendor> vendor_ = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger_;
  std::unique_ptr<NodeRegistry> registry_;
};

// ---- formats ----------------------------------------------------------------------------------

TEST_F(RegistryTest, BothFormatsRegisterTheirDevices) {
  registry_->Observe(Delimited("1", Reported(kT0)), kT0);
  registry_->Observe(MakeNode("j1", kJson, "2"), kT0);

  std::optional<device::NodeSnapshot> g1 = Snap("g1");
  ASSERT_TRUE(g1.has_value());
  ASSERT_EQ(g1->devices->devices.size(), 2u);
  EXPECT_EQ(g1->devices->devices[0].id, "GPU-a");
  EXPECT_EQ(g1->devices->devices[1].index, 1);
  EXPECT_EQ(g1->devices->format, device::RegisterFormat::kDelimited);
  std::optional<device::NodeSnapshot> j1 = Snap("j1");
  ASSERT_TRUE(j1.has_value());
  ASSERT_EQ(j1->devices->devices.size(), 2u);
  EXPECT_EQ(j1->devices->devices[1].id, "GPU-y");
  EXPECT_EQ(j1->devices->format, device::RegisterFormat::kJson);

  EXPECT_EQ(St("g1").format, NodeFormat::kDelimited);
  EXPECT_EQ(St("j1").format, NodeFormat::kJson);
  EXPECT_EQ(St("g1").availability, Availability::kAvailable);
  EXPECT_EQ(St("j1").availability, Availability::kAvailable);
  EXPECT_THAT(Health("g1"), ElementsAre(true, true));
  EXPECT_THAT(Health("j1"), ElementsAre(true, true));
  EXPECT_EQ(St("j1").devices, 2u);
  EXPECT_TRUE(St("j1").in_ledger);
}

TEST_F(RegistryTest, ARewriteInAnotherOrderChangesNothing) {
  // The v2.5.2 plugin rewrites its registration every 30 s in Go map order.
  registry_->Observe(MakeNode("g1",
                              "GPU-b,10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:"
                              "GPU-a,10,7680,100,NVIDIA-Tesla P4,0,true,0,hami-core:",
                              "1"),
                     kT0);
  const std::shared_ptr<const device::NodeDevices> first = Snap("g1")->devices;
  ASSERT_EQ(first->devices.size(), 2u);
  EXPECT_EQ(first->devices[0].id, "GPU-a");  // sorted by index
  registry_->Observe(MakeNode("g1", kDelimited, "2"), kT0);
  EXPECT_EQ(Snap("g1")->devices, first);  // the same object: not re-registered
}

TEST_F(RegistryTest, ANodeWithoutRegistrationIsNotInTheLedger) {
  std::vector<NodePatch> p = registry_->Observe(MakeNode("cpu", "", "1"), kT0);
  EXPECT_THAT(p, IsEmpty());  // no handshake stamped on GPU-less nodes (HAMi v2.5.2 does)
  EXPECT_FALSE(Snap("cpu").has_value());
  NodeStatus s = St("cpu");
  EXPECT_EQ(s.format, NodeFormat::kNone);
  EXPECT_EQ(s.availability, Availability::kNoRegistration);
  EXPECT_FALSE(s.in_ledger);
}

TEST_F(RegistryTest, APluginUpgradeSwitchesFormatAndLiveness) {
  registry_->Observe(Delimited("1", Reported(kT0)), kT0);
  kube::Node upgraded = MakeNode("g1", kJson, "5");
  upgraded.meta.annotations.Set(kHs, device::FormatHandshakeRequesting(kT0));
  // Long after the handshake would have timed out: JSON nodes ignore it and write none.
  EXPECT_THAT(registry_->Observe(upgraded, kT0 + absl::Minutes(10)), IsEmpty());
  EXPECT_THAT(registry_->Tick(kT0 + absl::Minutes(11)), IsEmpty());
  EXPECT_EQ(St("g1").format, NodeFormat::kJson);
  EXPECT_EQ(St("g1").availability, Availability::kAvailable);
  EXPECT_EQ(Snap("g1")->devices->devices[0].id, "GPU-x");
}

// ---- the handshake ----------------------------------------------------------------------------

TEST_F(RegistryTest, DelimitedHandshakeCycle) {
  // 1. The plugin reports: alive, and the registry answers Requesting_<now>.
  std::vector<NodePatch> p = registry_->Observe(Delimited("10", Reported(kT0)), kT0);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], (NodePatch{"g1", kHs, "Requesting_2027-01-15 08:00:00", "10"}));
  EXPECT_EQ(St("g1").availability, Availability::kAvailable);
  EXPECT_EQ(St("g1").last_report, kT0);

  // The same object again (a resync) asks for nothing new.
  EXPECT_THAT(registry_->Observe(Delimited("10", Reported(kT0)), kT0 + absl::Seconds(1)),
              IsEmpty());

  // 2. Our write lands: the registry sees Requesting_ and waits.
  EXPECT_THAT(registry_->Observe(Delimited("11", p[0].value), kT0 + absl::Seconds(1)), IsEmpty());
  EXPECT_THAT(registry_->Tick(kT0 + absl::Seconds(59)), IsEmpty());
  EXPECT_EQ(St("g1").availability, Availability::kAvailable);
  EXPECT_EQ(St("g1").handshake_deadline, kT0 + absl::Seconds(60));
  EXPECT_THAT(Health("g1"), ElementsAre(true, true));

  // 3. The plugin reports again at +30 s: a new Requesting_, a new deadline.
  const absl::Time t30 = kT0 + absl::Seconds(30);
  p = registry_->Observe(Delimited("12", Reported(t30)), t30);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].value, "Requesting_2027-01-15 08:00:30");
  registry_->Observe(Delimited("13", p[0].value), t30);
  EXPECT_THAT(registry_->Tick(kT0 + absl::Seconds(89)), IsEmpty());
  EXPECT_EQ(St("g1").availability, Availability::kAvailable);

  // 4. The plugin dies: 60 s after the last Requesting_ the node is unavailable, its devices
  //    unhealthy in the ledger, and the registry writes Deleted_ (once).
  p = registry_->Tick(kT0 + absl::Seconds(90));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], (NodePatch{"g1", kHs, "Deleted_2027-01-15 08:01:30", "13"}));
  EXPECT_EQ(St("g1").availability, Availability::kHandshakeTimeout);
  EXPECT_THAT(St("g1").detail, HasSubstr("no report"));
  EXPECT_THAT(Health("g1"), ElementsAre(false, false));
  EXPECT_THAT(registry_->Tick(kT0 + absl::Seconds(91)), IsEmpty());

  // The Deleted_ lands: still unavailable, nothing more to write.
  EXPECT_THAT(registry_->Observe(Delimited("14", p[0].value), kT0 + absl::Seconds(92)), IsEmpty());
  EXPECT_EQ(St("g1").availability, Availability::kHandshakeDeleted);
  EXPECT_THAT(registry_->Tick(kT0 + absl::Minutes(5)), IsEmpty());

  // 5. The plugin comes back: available again at once, and the cycle restarts.
  const absl::Time back = kT0 + absl::Minutes(6);
  p = registry_->Observe(Delimited("15", Reported(back)), back);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].value, device::FormatHandshakeRequesting(back));
  EXPECT_EQ(St("g1").availability, Availability::kAvailable);
  EXPECT_THAT(Health("g1"), ElementsAre(true, true));
}

TEST_F(RegistryTest, AFollowerThatNeverWritesUsesReportedAsHeartbeat) {
  registry_->Observe(Delimited("1", Reported(kT0)), kT0);
  // Nobody answers; the plugin rewrites Reported every 30 s: alive throughout.
  for (int i = 1; i <= 4; ++i) {
    const absl::Time t = kT0 + absl::Seconds(30 * i);
    registry_->Observe(Delimited(std::to_string(1 + i), Reported(t)), t);
    registry_->Tick(t + absl::Seconds(29));
    EXPECT_EQ(St("g1").availability, Availability::kAvailable) << i;
  }
  // The reports stop at +120 s: unavailable 60 s later.
  registry_->Tick(kT0 + absl::Seconds(179));
  EXPECT_EQ(St("g1").availability, Availability::kAvailable);
  std::vector<NodePatch> p = registry_->Tick(kT0 + absl::Seconds(180));
  EXPECT_EQ(St("g1").availability, Availability::kHandshakeTimeout);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_THAT(p[0].value, ::testing::StartsWith("Deleted_"));
}

TEST_F(RegistryTest, AnOldRequestingAfterARestartIsUnavailableAtOnce) {
  // The previous leader asked 5 minutes ago and the plugin never answered.
  std::vector<NodePatch> p = registry_->Observe(
      Delimited("7", device::FormatHandshakeRequesting(kT0 - absl::Minutes(5))), kT0);
  EXPECT_EQ(St("g1").availability, Availability::kHandshakeTimeout);
  EXPECT_THAT(Health("g1"), ElementsAre(false, false));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].value, device::FormatHandshakeDeleted(kT0));
}

TEST_F(RegistryTest, AnUnusableRequestingIsRewrittenWithTheObservationTime) {
  // A bare "Requesting" (which panics HAMi v2.5.2) and one far in the future (another
  // scheduler's local time) both count from when they were first seen.
  for (const std::string& bad :
       {std::string("Requesting"), device::FormatHandshakeRequesting(kT0 + absl::Hours(8))}) {
    Make();
    std::vector<NodePatch> p = registry_->Observe(Delimited("3", bad), kT0);
    ASSERT_EQ(p.size(), 1u) << bad;
    EXPECT_EQ(p[0].value, device::FormatHandshakeRequesting(kT0)) << bad;
    EXPECT_EQ(St("g1").availability, Availability::kAvailable) << bad;
    EXPECT_EQ(St("g1").handshake_deadline, kT0 + absl::Seconds(60)) << bad;
  }
}

TEST_F(RegistryTest, ALostWriteIsAskedForAgainAfterTheRetryInterval) {
  std::vector<NodePatch> p = registry_->Observe(Delimited("1", Reported(kT0)), kT0);
  ASSERT_EQ(p.size(), 1u);
  // The write failed: the node does not change.
  EXPECT_THAT(registry_->Tick(kT0 + absl::Seconds(14)), IsEmpty());
  std::vector<NodePatch> again = registry_->Tick(kT0 + absl::Seconds(15));
  ASSERT_EQ(again.size(), 1u);
  // Same evidence time: a retry never pushes the deadline out.
  EXPECT_EQ(again[0], p[0]);
}

TEST_F(RegistryTest, ResetAsksLetsANewLeaderAskAtOnce) {
  // A follower's ask was dropped; when it becomes the leader it must not wait for the retry
  // interval.
  std::vector<NodePatch> p = registry_->Observe(Delimited("1", Reported(kT0)), kT0);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_THAT(registry_->Tick(kT0 + absl::Seconds(1)), IsEmpty());
  registry_->ResetAsks();
  std::vector<NodePatch> again = registry_->Tick(kT0 + absl::Seconds(1));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0], p[0]);
  EXPECT_THAT(registry_->Tick(kT0 + absl::Seconds(2)), IsEmpty());
}

TEST_F(RegistryTest, UnselectedAndJsonNodesGetNoHandshakeWrites) {
  NodeRegistry::Options o;
  o.selector = *NodeSelector::Parse("gpu=true");
  Make(o);
  EXPECT_THAT(registry_->Observe(Delimited("1", Reported(kT0)), kT0), IsEmpty());
  kube::Node j = MakeNode("j1", kJson, "1");
  j.meta.labels.Set("gpu", "true");
  EXPECT_THAT(registry_->Observe(j, kT0), IsEmpty());
  EXPECT_THAT(registry_->Tick(kT0 + absl::Hours(1)), IsEmpty());
}

// ---- JSON liveness ----------------------------------------------------------------------------

TEST_F(RegistryTest, JsonLivenessIsReadinessAndAllocatableGpus) {
  kube::Node n = MakeNode("j1", kJson, "1");
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kAvailable);

  n.ready = kube::ConditionStatus::kFalse;
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kNotReady);
  EXPECT_THAT(Health("j1"), ElementsAre(false, false));
  n.ready = kube::ConditionStatus::kUnknown;
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kNotReady);

  n.ready = kube::ConditionStatus::kTrue;
  n.allocatable.Set("nvidia.com/gpu", "0");
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kNoAllocatable);
  EXPECT_THAT(Health("j1"), ElementsAre(false, false));

  n.allocatable.Erase("nvidia.com/gpu");
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kNoAllocatable);

  n.allocatable.Set("nvidia.com/gpu", "garbage");
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kNoAllocatable);

  n.allocatable.Set("nvidia.com/gpu", "4");
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kAvailable);
  EXPECT_THAT(Health("j1"), ElementsAre(true, true));
}

TEST_F(RegistryTest, AnUnhealthyDeviceStaysUnhealthyWhenTheNodeIsAvailable) {
  const std::string reg =
      R"([{"id":"GPU-x","count":10,"devmem":8192,"devcore":100,"type":"T","health":true},)"
      R"({"id":"GPU-y","count":10,"devmem":8192,"devcore":100,"type":"T"}])";
  registry_->Observe(MakeNode("j1", reg, "1"), kT0);
  EXPECT_THAT(Health("j1"), ElementsAre(true, false));
}

TEST_F(RegistryTest, ResourceCountNameIsConfigurable) {
  NodeRegistry::Options o;
  o.resource_count_name = "example.com/vgpu";
  Make(o);
  kube::Node n = MakeNode("j1", kJson, "1");  // has nvidia.com/gpu only
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kNoAllocatable);
  n.allocatable.Set("example.com/vgpu", "2");
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kAvailable);
}

// ---- cordon -----------------------------------------------------------------------------------

TEST_F(RegistryTest, CordonListFollowsTheAnnotation) {
  kube::Node n = MakeNode("j1", kJson, "1");
  n.meta.annotations.Set("hami.io/device-cordon", " GPU-y , ,GPU-zz");
  registry_->Observe(n, kT0);
  std::optional<device::NodeSnapshot> s = Snap("j1");
  ASSERT_TRUE(s.has_value());
  EXPECT_THAT(s->devices->cordoned, ElementsAre("GPU-y", "GPU-zz"));
  EXPECT_TRUE(s->devices->IsCordoned("GPU-y"));
  EXPECT_FALSE(s->devices->IsCordoned("GPU-x"));
  EXPECT_EQ(St("j1").cordoned, 2u);

  n.meta.annotations.Erase("hami.io/device-cordon");
  registry_->Observe(n, kT0);
  EXPECT_THAT(Snap("j1")->devices->cordoned, IsEmpty());
}

// ---- selector ---------------------------------------------------------------------------------

TEST(NodeSelectorTest, ParsesHamiSyntax) {
  absl::StatusOr<NodeSelector> s = NodeSelector::Parse(" gpu=on , example.com/pool=a-1,empty=");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ToString(), "empty=,example.com/pool=a-1,gpu=on");
  EXPECT_TRUE(s->Matches({{"gpu", "on"}, {"example.com/pool", "a-1"}, {"empty", ""}, {"x", "y"}}));
  EXPECT_FALSE(s->Matches({{"gpu", "on"}, {"example.com/pool", "a-1"}}));  // empty= needs the key
  EXPECT_FALSE(s->Matches({{"gpu", "off"}, {"example.com/pool", "a-1"}, {"empty", ""}}));

  ASSERT_TRUE(NodeSelector::Parse("").ok());
  EXPECT_TRUE(NodeSelector::Parse("  ")->empty());
  EXPECT_TRUE(NodeSelector::Parse("")->Matches({}));
  EXPECT_FALSE(NodeSelector::Parse("a=b=c").ok());  // '=' is not a label value byte
}

TEST(NodeSelectorTest, BadSyntaxIsInvalidArgument) {
  for (const char* bad : {"gpu", "gpu=on,", ",gpu=on", "=on", "gpu=on,gpu=off", "-x=1", "a/b/c=1",
                          "UPPER.example/x=1", "k=v v", "k=-v",
                          "k=0123456789012345678901234567890123456789012345678901234567890123"}) {
    absl::StatusOr<NodeSelector> s = NodeSelector::Parse(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(NodeSelector::Parse("gpu").status().message()),
              HasSubstr("must be formatted as key=value"));
}

TEST_F(RegistryTest, SelectorIncludesExcludesAndFollowsLabelChanges) {
  NodeRegistry::Options o;
  o.selector = *NodeSelector::Parse("pool=gpu");
  Make(o);
  kube::Node n = MakeNode("j1", kJson, "1");
  Bind("pod-1", "j1", "GPU-x");

  // Not selected: registered so the pod on it keeps its usage, but nothing fits.
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kNotSelected);
  EXPECT_FALSE(St("j1").selected);
  EXPECT_THAT(Health("j1"), ElementsAre(false, false));
  EXPECT_EQ(Snap("j1")->usage[0].usedmem, 2048);

  // Labelled: it offers its devices.
  n.meta.labels.Set("pool", "gpu");
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kAvailable);
  EXPECT_THAT(Health("j1"), ElementsAre(true, true));
  EXPECT_EQ(Snap("j1")->usage[0].usedmem, 2048);

  // Label value changed: excluded again, usage kept.
  n.meta.labels.Set("pool", "cpu");
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").availability, Availability::kNotSelected);
  EXPECT_THAT(Health("j1"), ElementsAre(false, false));
  EXPECT_EQ(Snap("j1")->usage[0].usedmem, 2048);
  EXPECT_THAT(ledger_.FindProblems().unregistered, IsEmpty());
}

// ---- deletion and removal ---------------------------------------------------------------------

TEST_F(RegistryTest, ADeletedNodeTakesItsDevicesAndUsage) {
  registry_->Observe(MakeNode("j1", kJson, "1"), kT0);
  Bind("pod-1", "j1", "GPU-x");
  EXPECT_EQ(ledger_.Full().nodes.size(), 1u);

  EXPECT_TRUE(registry_->Forget("j1"));
  EXPECT_FALSE(Snap("j1").has_value());
  EXPECT_THAT(ledger_.Full().nodes, IsEmpty());  // no device, no usage left for metrics
  EXPECT_FALSE(registry_->Find("j1").has_value());
  EXPECT_THAT(registry_->Registrations(), IsEmpty());
  // The pod's record stays until its own deletion is observed, holding nothing; it is reported.
  ASSERT_EQ(ledger_.FindProblems().unregistered.size(), 1u);
  EXPECT_EQ(ledger_.FindProblems().unregistered[0].uid, "pod-1");
  EXPECT_FALSE(registry_->Forget("j1"));

  // A node re-created with the same name starts afresh and counts the pod again.
  registry_->Observe(MakeNode("j1", kJson, "9"), kT0);
  EXPECT_EQ(Snap("j1")->usage[0].usedmem, 2048);
}

TEST_F(RegistryTest, ARemovedRegistrationKeepsDevicesUnavailable) {
  registry_->Observe(MakeNode("j1", kJson, "1"), kT0);
  Bind("pod-1", "j1", "GPU-y");
  registry_->Observe(MakeNode("j1", "", "2"), kT0);
  NodeStatus s = St("j1");
  EXPECT_EQ(s.availability, Availability::kNoRegistration);
  EXPECT_EQ(s.format, NodeFormat::kNone);
  EXPECT_TRUE(s.in_ledger);
  EXPECT_THAT(Health("j1"), ElementsAre(false, false));
  EXPECT_EQ(Snap("j1")->usage[1].usedmem, 2048);
}

// ---- malformed registrations ------------------------------------------------------------------

TEST_F(RegistryTest, MalformedRegistrationsAreReportedAndChangeNothing) {
  // Never registered: reported, not in the ledger.
  registry_->Observe(MakeNode("bad", "GPU-a,10,notanumber,100,T,0,true:", "1"), kT0);
  EXPECT_FALSE(Snap("bad").has_value());
  EXPECT_THAT(St("bad").decode_error, HasSubstr("devmem"));
  EXPECT_EQ(St("bad").decode_errors, 1u);
  EXPECT_EQ(St("bad").availability, Availability::kNoRegistration);

  // Registered, then malformed in both formats: the ledger keeps what it had.
  kube::Node n = MakeNode("j1", kJson, "1");
  registry_->Observe(n, kT0);
  Bind("pod-1", "j1", "GPU-x");
  const std::shared_ptr<const device::NodeDevices> before = Snap("j1")->devices;
  for (const char* bad : {"[{\"id\":\"GPU-x\",", "[{\"count\":1}]", "no-colon-at-all",
                          "GPU-a,1:", "[]garbage", "\xff\xfe"}) {
    n.meta.annotations.Set("hami.io/node-nvidia-register", bad);
    n.meta.resource_version = std::string("r") + bad;
    registry_->Observe(n, kT0);
    std::optional<device::NodeSnapshot> now = Snap("j1");
    ASSERT_TRUE(now.has_value()) << bad;
    EXPECT_EQ(now->devices, before) << bad;  // not even re-registered
    EXPECT_EQ(now->usage[0].usedmem, 2048) << bad;
    EXPECT_FALSE(St("j1").decode_error.empty()) << bad;
    EXPECT_EQ(St("j1").format, NodeFormat::kJson) << bad;
    EXPECT_EQ(St("j1").availability, Availability::kAvailable) << bad;
  }
  EXPECT_EQ(St("j1").decode_errors, 6u);
  // The same bad value again is not counted twice.
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").decode_errors, 6u);

  // A good value again clears the error.
  n.meta.annotations.Set("hami.io/node-nvidia-register", kJson);
  registry_->Observe(n, kT0);
  EXPECT_EQ(St("j1").decode_error, "");
}

TEST_F(RegistryTest, PairScoresFollowTheirAnnotation) {
  // hami.io/node-nvidia-score decodes with the registration (HAMi v2.10 device.go,
  // GetNodeDevices): a change of the scores alone re-registers the node; devices are sorted by
  // index and the matrix with them; scores that do not decode are a registration that does not
  // decode (HAMi keeps the node's previous devices; so does Tessera).
  constexpr char kScoreKey[] = "hami.io/node-nvidia-score";
  kube::Node n = MakeNode("j1", kJson, "1");
  registry_->Observe(n, kT0);
  EXPECT_THAT(Snap("j1")->devices->pair_scores, IsEmpty());  // missing: all zeros, no matrix
  Bind("pod-1", "j1", "GPU-x");

  n.meta.annotations.Set(kScoreKey, R"([{"uuid":"GPU-y","score":{"GPU-x":450}}])");
  n.meta.resource_version = "2";
  registry_->Observe(n, kT0);
  std::shared_ptr<const device::NodeDevices> scored = Snap("j1")->devices;
  EXPECT_EQ(scored->PairScore(1, 0), 450);  // GPU-y (index 1) towards GPU-x
  EXPECT_EQ(scored->PairScore(0, 1), 0);
  EXPECT_EQ(Snap("j1")->usage[0].usedmem, 2048);  // usage kept

  n.meta.annotations.Set(kScoreKey, "not-valid-json");
  n.meta.resource_version = "3";
  registry_->Observe(n, kT0);
  EXPECT_EQ(Snap("j1")->devices, scored);  // the last good registration stays
  EXPECT_THAT(St("j1").decode_error, HasSubstr("hami.io/node-nvidia-score"));
  EXPECT_EQ(St("j1").decode_errors, 1u);

  n.meta.annotations.Erase(kScoreKey);
  n.meta.resource_version = "4";
  registry_->Observe(n, kT0);
  EXPECT_THAT(Snap("j1")->devices->pair_scores, IsEmpty());
  EXPECT_EQ(St("j1").decode_error, "");

  // A node that never registered with scores that do not decode is not registered.
  kube::Node fresh = MakeNode("j2", kJson, "1");
  fresh.meta.annotations.Set(kScoreKey, R"([{"uuid":"GPU-x","score":{"GPU-y":1.5}}])");
  registry_->Observe(fresh, kT0);
  EXPECT_FALSE(Snap("j2").has_value());
  EXPECT_EQ(St("j2").availability, Availability::kNoRegistration);
}

TEST_F(RegistryTest, MalformedDelimitedRegistrationKeepsTheHandshakeGoing) {
  registry_->Observe(Delimited("1", Reported(kT0)), kT0);
  kube::Node n = Delimited("2", Reported(kT0 + absl::Seconds(30)));
  n.meta.annotations.Set("hami.io/node-nvidia-register", "GPU-a,1:");
  std::vector<NodePatch> p = registry_->Observe(n, kT0 + absl::Seconds(30));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_THAT(p[0].value, ::testing::StartsWith("Requesting_"));
  EXPECT_EQ(Snap("g1")->devices->devices.size(), 2u);
}

// ---- status and registrations -----------------------------------------------------------------

TEST_F(RegistryTest, StatusIsSortedAndRegistrationsMatchTheLedger) {
  registry_->Observe(MakeNode("z", kJson, "1"), kT0);
  kube::Node down = MakeNode("a", kJson, "1");
  down.ready = kube::ConditionStatus::kFalse;
  registry_->Observe(down, kT0);
  registry_->Observe(MakeNode("m", "", "1"), kT0);
  std::vector<NodeStatus> all = registry_->Status();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].name, "a");
  EXPECT_EQ(all[1].name, "m");
  EXPECT_EQ(all[2].name, "z");
  EXPECT_EQ(AvailabilityName(all[0].availability), "not-ready");
  EXPECT_EQ(NodeFormatName(all[2].format), "json");

  // An audit that recomputes from Registrations() agrees with the live ledger.
  Bind("pod-1", "a", "GPU-x");
  std::unique_ptr<ledger::Ledger> again =
      ledger::Ledger::Recompute(registry_->Registrations(), ledger_.Records(), {});
  EXPECT_TRUE(Diff(ledger_, *again).Empty()) << Diff(ledger_, *again).ToString();
}

}  // namespace
}  // namespace tessera::accounting
