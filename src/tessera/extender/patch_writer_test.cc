// PatchWriter against an in-process apisim over the real HTTP client.
#include "tessera/extender/patch_writer.h"

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/testing/apisim_env.h"
#include "tessera/testing/gate_transport.h"
#include "tessera/testing/reading_clock.h"
#include "tessera/testing/wait.h"

namespace tessera::extender {
namespace {

using ::tessera::testing::Eventually;
using ::tessera::testing::ReadingClock;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kPodPath[] = "/api/v1/namespaces/default/pods/";
const absl::Time kNow = absl::FromUnixSeconds(1767225600);

struct Settled {
  std::string uid;
  uint64_t seq;
  absl::Status status;
};

class PatchWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.Start();
    gate_ = std::make_unique<testing::GateTransport>(env_.faults(), "PATCH", kPodPath);
    gated_ = std::make_unique<kube::ApiClient>(
        gate_.get(), kube::ApiClient::Options{kube::RetryPolicy{.max_attempts = 1}, nullptr});
  }

  // A pod in the API server, and a job that sets annotation "hami.io/vgpu-node" to `value` on it.
  PatchWriter::Job Job(const std::string& pod, const std::string& value, uint64_t seq = 1) {
    absl::StatusOr<kube::Pod> got = env_.client()->GetPod("default", pod);
    if (!got.ok()) {
      env_.CreatePod(pod, R"({"cpu":"1"})");
      got = env_.client()->GetPod("default", pod);
    }
    EXPECT_TRUE(got.ok()) << got.status();
    PatchWriter::Job job;
    job.ns = "default";
    job.name = pod;
    job.uid = got.ok() ? got->meta.uid : "";
    job.seq = seq;
    job.created = kNow;
    job.patch.annotations.emplace_back("hami.io/vgpu-node", value);
    job.patch.uid = job.uid;
    return job;
  }
  std::string Annotation(const std::string& pod) {
    return std::string(
        env_.client()->GetPod("default", pod)->meta.annotations.Get("hami.io/vgpu-node", "<none>"));
  }
  PatchWriter::Settle Record() {
    return [this](const PatchWriter::Job& job, const absl::Status& status) {
      MutexLock l(&mu_);
      settled_.push_back({job.uid, job.seq, status});
    };
  }
  std::vector<Settled> settled() {
    MutexLock l(&mu_);
    return settled_;
  }

  testing::ApisimEnv env_;
  std::unique_ptr<testing::GateTransport> gate_;
  std::unique_ptr<kube::ApiClient> gated_;
  Mutex mu_;
  std::vector<Settled> settled_ ABSL_GUARDED_BY(mu_);
};

TEST_F(PatchWriterTest, TakeWaitsForThePatchAndReturnsThePatchedPod) {
  PatchWriter writer({.threads = 2}, env_.client(), Record());
  PatchWriter::Job job = Job("p1", "n1", 7);
  const std::string uid = job.uid;
  writer.Submit(std::move(job));
  std::optional<PatchWriter::Landed> landed = writer.Take(uid);
  ASSERT_TRUE(landed.has_value());
  EXPECT_TRUE(landed->done);
  EXPECT_TRUE(landed->status.ok()) << landed->status;
  ASSERT_TRUE(landed->pod.has_value());
  EXPECT_EQ(landed->pod->meta.annotations.Get("hami.io/vgpu-node"), "n1");
  EXPECT_EQ(Annotation("p1"), "n1");
  // Settled once, before Take saw it.
  std::vector<Settled> s = settled();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].uid, uid);
  EXPECT_EQ(s[0].seq, 7u);
  EXPECT_TRUE(s[0].status.ok());
  // Taken: nothing is kept for the pod any more.
  EXPECT_FALSE(writer.Take(uid).has_value());
}

TEST_F(PatchWriterTest, AFailedPatchIsSettledWithItsErrorAndNotRetried) {
  PatchWriter writer({.threads = 1}, env_.client(), Record());
  env_.faults()->Inject("PATCH", std::string(kPodPath) + "p1", 500, "InternalError");
  PatchWriter::Job job = Job("p1", "n1");
  const std::string uid = job.uid;
  writer.Submit(std::move(job));
  std::optional<PatchWriter::Landed> landed = writer.Take(uid);
  ASSERT_TRUE(landed.has_value());
  EXPECT_TRUE(landed->done);
  EXPECT_THAT(std::string(landed->status.message()),
              HasSubstr("patch pod default/p1 annotations: "));
  EXPECT_FALSE(landed->pod.has_value());
  std::vector<Settled> s = settled();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, landed->status);
  EXPECT_EQ(env_.faults()->Matching("PATCH", std::string(kPodPath) + "p1").size(), 1u);
  EXPECT_EQ(Annotation("p1"), "<none>");
}

// A re-filter's patch must not overtake the earlier one: with several writers the two could
// otherwise be written at once, and the older decision land last.
TEST_F(PatchWriterTest, APodsPatchesNeverOvertakeEachOther) {
  // A clock that stands still (the wait never ends) and tells when the re-filter waits.
  FakeClock time;
  ReadingClock clock(&time);
  PatchWriter writer({.threads = 4, .clock = &clock}, gated_.get(), Record());
  PatchWriter::Job first = Job("p1", "n1", 1);
  PatchWriter::Job second = Job("p1", "n2", 2);
  const std::string uid = first.uid;
  writer.Submit(std::move(first));
  gate_->WaitHeld(1);  // the first patch is on the wire
  std::atomic<bool> submitted{false};
  std::thread refilter([&] {
    writer.Submit(std::move(second));
    submitted = true;
  });
  // Three writers are idle, yet the second patch waits for the first: Submit waits in Take,
  // which reads the clock for its deadline and again before each wait.
  EXPECT_TRUE(clock.WaitForReads(refilter.get_id(), 2));
  EXPECT_FALSE(submitted.load());
  EXPECT_EQ(gate_->held(), 1);
  gate_->Open();
  refilter.join();
  std::optional<PatchWriter::Landed> landed = writer.Take(uid);
  ASSERT_TRUE(landed.has_value() && landed->done);
  EXPECT_EQ(landed->pod->meta.annotations.Get("hami.io/vgpu-node"), "n2");
  EXPECT_EQ(Annotation("p1"), "n2");
  std::vector<uint64_t> order;
  for (const Settled& s : settled()) {
    order.push_back(s.seq);
  }
  EXPECT_THAT(order, ElementsAre(1u, 2u));
}

TEST_F(PatchWriterTest, TakeGivesUpAfterTheWaitAndThePatchStaysForALaterTake) {
  PatchWriter writer({.threads = 1, .wait = absl::Milliseconds(20)}, gated_.get(), Record());
  PatchWriter::Job job = Job("p1", "n1");
  const std::string uid = job.uid;
  writer.Submit(std::move(job));
  gate_->WaitHeld(1);
  std::optional<PatchWriter::Landed> early = writer.Take(uid);
  ASSERT_TRUE(early.has_value());
  EXPECT_FALSE(early->done);
  gate_->Open();
  // The patch is still the pod's; a later Take (with a longer wait than 20 ms, in a loop)
  // finds it landed.
  std::optional<PatchWriter::Landed> later;
  Eventually([&] {
    later = writer.Take(uid);
    return later && later->done;
  });
  ASSERT_TRUE(later.has_value());
  EXPECT_TRUE(later->done);
  EXPECT_TRUE(later->status.ok());
}

// The wait is measured on the writer's clock: a test drives it instead of sleeping it out.
TEST_F(PatchWriterTest, TakeGivesUpWhenItsClockPassesTheWait) {
  FakeClock time;
  ReadingClock clock(&time);
  PatchWriter writer({.threads = 1, .wait = absl::Hours(1), .clock = &clock}, gated_.get(),
                     Record());
  PatchWriter::Job job = Job("p1", "n1");
  const std::string uid = job.uid;
  writer.Submit(std::move(job));
  gate_->WaitHeld(1);
  std::optional<PatchWriter::Landed> early;
  std::thread take([&] { early = writer.Take(uid); });
  // Take has read the clock for its deadline (an hour from then): pass it.
  EXPECT_TRUE(clock.WaitForReads(take.get_id(), 1));
  time.Advance(absl::Hours(1));
  take.join();
  ASSERT_TRUE(early.has_value());
  EXPECT_FALSE(early->done);
  gate_->Open();
}

TEST_F(PatchWriterTest, DropLandedForgetsOnlyOldLandedPatches) {
  PatchWriter writer({.threads = 1}, env_.client(), Record());
  PatchWriter::Job old_job = Job("old", "n1");
  PatchWriter::Job young_job = Job("young", "n1");
  young_job.created = kNow + absl::Minutes(1);
  PatchWriter::Job last = Job("last", "n1");
  const std::string old_uid = old_job.uid, young_uid = young_job.uid;
  writer.Submit(std::move(old_job));
  writer.Submit(std::move(young_job));
  const std::string last_uid = last.uid;
  writer.Submit(std::move(last));
  // One writer in queue order: once the last has landed, so have the others.
  ASSERT_TRUE(writer.Take(last_uid)->done);
  writer.DropLanded(kNow);
  EXPECT_FALSE(writer.Take(old_uid).has_value());
  std::optional<PatchWriter::Landed> young = writer.Take(young_uid);
  ASSERT_TRUE(young.has_value());
  EXPECT_TRUE(young->done);
}

TEST_F(PatchWriterTest, WriteIsSynchronousAndSettles) {
  PatchWriter writer({.threads = 0}, env_.client(), Record());
  PatchWriter::Job job = Job("p1", "n1", 3);
  absl::StatusOr<kube::Pod> pod = writer.Write(job);
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->meta.annotations.Get("hami.io/vgpu-node"), "n1");
  ASSERT_EQ(settled().size(), 1u);
  EXPECT_EQ(settled()[0].seq, 3u);
  // Nothing is kept for Take.
  EXPECT_FALSE(writer.Take(job.uid).has_value());
  // A patch naming another uid is refused by the API server (the uid precondition).
  job.patch.uid = "uid-of-another-pod";
  absl::StatusOr<kube::Pod> refused = writer.Write(job);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("patch pod default/p1"));
  ASSERT_EQ(settled().size(), 2u);
  EXPECT_FALSE(settled()[1].status.ok());
}

}  // namespace
}  // namespace tessera::extender
