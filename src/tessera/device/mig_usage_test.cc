// Tests of the MIG usage rebuild against HAMi v2.10.0's getNodesUsage rules
// (pkg/scheduler/scheduler.go; its cases in pkg/scheduler/mig_allocation_test.go).
#include "tessera/device/mig_usage.h"

#include "gtest/gtest.h"

namespace tessera::device {
namespace {

NodeDevices Node() {
  NodeDevices n;
  n.node = "gpu-a100-1";
  for (const char* id : {"GPU-m0", "GPU-m1", "GPU-s"}) {
    DeviceInfo d;
    d.id = id;
    d.mode = std::string_view(id) == "GPU-s" ? "hami-core" : "mig";
    n.devices.push_back(d);
  }
  return n;
}

MigAllocation Alloc(int32_t c, int32_t d, std::string uuid, MigPlacement p) {
  MigAllocation a;
  a.container_index = c;
  a.device_index = d;
  a.gpu_uuid = std::move(uuid);
  a.profile = "1g.5gb";
  a.placement = p;
  return a;
}

ContainerDevice Dev(std::string uuid) { return ContainerDevice{std::move(uuid), "NVIDIA", 1, 1}; }

TEST(MigUsageTest, EachDeviceConsumesItsCardsReservationsInOrder) {
  const PodDevices devices = {{Dev("GPU-m0"), Dev("GPU-m0")}, {Dev("GPU-m1"), Dev("GPU-s")}};
  const std::vector<MigAllocation> allocs = {
      Alloc(0, 0, "GPU-m0", {6, 1}), Alloc(0, 1, "GPU-m0", {5, 1}), Alloc(1, 0, "GPU-m1", {0, 2})};
  MigPodUsage u = MigUsageOfPod(Node(), devices, allocs);
  EXPECT_EQ(u.occupied[0], (std::vector<MigPlacement>{{6, 1}, {5, 1}}));
  EXPECT_EQ(u.occupied[1], (std::vector<MigPlacement>{{0, 2}}));
  EXPECT_TRUE(u.occupied[2].empty());
  EXPECT_TRUE(u.problems.empty());
}

// Device annotations collapsed per card still restore every reservation ("restored MIG
// reservations missing from cached Pod devices").
TEST(MigUsageTest, LeftOverReservationsOnAMigCardAreRestored) {
  MigPodUsage u = MigUsageOfPod(Node(), {{Dev("GPU-m0")}},
                                {Alloc(0, 0, "GPU-m0", {6, 1}), Alloc(0, 1, "GPU-m0", {5, 1})});
  EXPECT_EQ(u.occupied[0], (std::vector<MigPlacement>{{6, 1}, {5, 1}}));
  EXPECT_TRUE(u.problems.empty());
}

TEST(MigUsageTest, DisagreementsFailClosed) {
  // A mig card used without a reservation (also what an undecodable annotation gives).
  MigPodUsage none = MigUsageOfPod(Node(), {{Dev("GPU-m1")}}, {});
  ASSERT_EQ(none.problems.size(), 1U);
  EXPECT_EQ(none.problems[0].device, 1U);
  EXPECT_EQ(none.problems[0].why, "MIG device without a reservation");
  // A reservation on the hami-core card.
  MigPodUsage core = MigUsageOfPod(Node(), {{Dev("GPU-s")}}, {Alloc(0, 0, "GPU-s", {0, 1})});
  ASSERT_FALSE(core.problems.empty());
  EXPECT_EQ(core.problems[0].device, 2U);
  EXPECT_EQ(core.problems[0].why, "a MIG reservation on a hami-core card");
  EXPECT_TRUE(core.occupied[2].empty());
  // A reservation for a card the node does not have: every mig card is unusable.
  MigPodUsage unknown = MigUsageOfPod(Node(), {}, {Alloc(0, 0, "GPU-gone", {0, 1})});
  ASSERT_EQ(unknown.problems.size(), 2U);
  EXPECT_EQ(unknown.problems[0].device, 0U);
  EXPECT_EQ(unknown.problems[1].device, 1U);
  EXPECT_EQ(unknown.problems[1].why, "MIG reservation for an unknown card");
  // A device of a card the node no longer has counts nothing.
  MigPodUsage stale = MigUsageOfPod(Node(), {{Dev("GPU-old")}}, {});
  EXPECT_TRUE(stale.problems.empty());
}

}  // namespace
}  // namespace tessera::device
