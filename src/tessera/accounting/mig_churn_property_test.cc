// Property (docs/mig.md): random churn of MIG pods — filters deciding on the ledger's snapshot
// and reserving their choice, binds observed with or without the plugin's realisation, deletes,
// deletes the ledger never hears of (lost events), expiries and resyncs from the truth — never
// leaves two holders of one card with overlapping placements, and after a resync the ledger
// equals a recompute from the truth (nothing leaks).
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "tessera/device/mig.h"
#include "tessera/ledger/ledger.h"
#include "tessera/schedule/fit.h"
#include "tessera/testing/objects.h"

namespace tessera::accounting {
namespace {

constexpr char kNode[] = "m1";

// No two placements in use on any card of the node overlap, and the ledger reports no overlap.
// Adds the placements in use to `*in_use`.
void ExpectNoOverlap(const ledger::Ledger& l, int step, int64_t* in_use) {
  std::optional<device::NodeSnapshot> snap = l.Snapshot({kNode})[0];
  ASSERT_TRUE(snap.has_value());
  for (size_t card = 0; card < snap->mig.size(); ++card) {
    const auto& o = snap->mig[card].occupied;
    *in_use += static_cast<int64_t>(o.size());
    for (size_t i = 0; i < o.size(); ++i) {
      for (size_t j = i + 1; j < o.size(); ++j) {
        ASSERT_FALSE(o[i].Overlaps(o[j])) << "step " << step << " card " << card;
      }
    }
  }
  for (const ledger::MigProblem& p : l.FindProblems().mig) {
    ASSERT_NE(p.kind, ledger::MigProblemKind::kOverlap) << "step " << step << ": " << p.why;
    ASSERT_NE(p.kind, ledger::MigProblemKind::kUnusable) << "step " << step << ": " << p.why;
  }
}

TEST(MigChurnPropertyTest, PlacementsNeverOverlapAndNothingLeaks) {
  const auto node = ::tessera::testing::MigNodeDevices(kNode, {"GPU-m0", "GPU-m1"});
  ledger::Ledger l;
  ASSERT_TRUE(l.SetNode(node).ok());
  std::map<std::string, ledger::PodAllocation> truth;  // the API server's bound pods
  std::mt19937 rng(26);
  const absl::Time t0 = absl::FromUnixSeconds(1'800'000'000);
  absl::Time now = t0;
  const int32_t sizes[] = {4000, 4000, 8000, 15000, 30000};
  int next = 0, placed = 0;
  int64_t in_use = 0;  // placements in use, summed over the steps
  for (int step = 0; step < 3000; ++step) {
    now += absl::Seconds(1);
    const int action = static_cast<int>(rng() % 10);
    if (action < 4) {  // filter: decide on the snapshot, reserve the choice
      device::PodRequest req;
      device::ContainerRequest c;
      c.nums = 1 + static_cast<int32_t>(rng() % 2);
      c.memreq = sizes[rng() % 5];
      req.containers = {c};
      schedule::Fitter fitter;
      const device::PodConstraints constraints;
      fitter.Prepare(req, constraints, device::GpuPolicy{});
      std::optional<device::NodeSnapshot> snap = l.Snapshot({kNode})[0];
      ASSERT_TRUE(snap.has_value());
      if (!fitter.Fit(*snap)) {
        continue;
      }
      const std::string uid = "p" + std::to_string(next++);
      const device::PodDevices devices = fitter.BuildPodDevices(*snap);
      ASSERT_TRUE(l.Reserve(uid, "ml", uid, kNode, devices, now + absl::Seconds(5), 0,
                            device::MigAllocationsOf(devices, fitter.BuildMigReservations(*snap)))
                      .ok());
      ++placed;
    } else if (action < 7) {  // bind observed: the reservation becomes a record (maybe realised)
      std::vector<ledger::Reservation> res = l.Reservations();
      if (res.empty()) {
        continue;
      }
      const ledger::Reservation& r = res[rng() % res.size()];
      ledger::PodAllocation p{r.uid, r.ns,  r.name, r.node,    r.node,
                              false, false, false,  r.devices, 0};
      p.mig = r.mig;
      if (rng() % 2 == 0) {
        for (device::MigAllocation& a : p.mig) {
          a.mig_uuid = "MIG-" + r.uid;
          a.gpu_instance_id = 1;
          a.compute_instance_id = 0;
        }
      }
      ASSERT_TRUE(l.Apply(p).ok());
      truth[p.uid] = p;
    } else if (action < 9) {  // delete, or a delete the ledger never hears of
      if (truth.empty()) {
        continue;
      }
      auto it = truth.begin();
      std::advance(it, static_cast<long>(rng() % truth.size()));
      if (action == 7) {
        l.Remove(it->first);
      }
      truth.erase(it);
    } else {  // expiry, then a resync from the truth
      l.ExpireReservations(now);
      std::vector<ledger::PodAllocation> pods;
      for (const auto& [uid, p] : truth) {
        pods.push_back(p);
      }
      std::unique_ptr<ledger::Ledger> want =
          ledger::Ledger::Recompute({node}, pods, l.Reservations());
      for (const ledger::RecordDiff& d : Diff(l, *want).records) {
        if (d.reservation) {
          continue;
        }
        auto t = truth.find(d.uid);
        if (t == truth.end()) {
          l.Remove(d.uid);
        } else {
          ASSERT_TRUE(l.Apply(t->second).ok());
        }
      }
      const ledger::LedgerDiff left = Diff(l, *want);
      ASSERT_TRUE(left.Empty()) << "step " << step << "\n" << left.ToString();
    }
    ASSERT_NO_FATAL_FAILURE(ExpectNoOverlap(l, step, &in_use));
  }
  EXPECT_GT(placed, 300);       // the churn really placed pods
  EXPECT_GT(in_use, 3000 * 2);  // on MIG placements, several at a time on average
}

}  // namespace
}  // namespace tessera::accounting
