#include "tessera/sim/control_plane.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>

#include <stdlib.h>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/testing/wait.h"

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  char tmpl[] = "/tmp/control-plane-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

TEST(ControlPlaneEnvTest, ParsesWhatUpWrites) {
  absl::StatusOr<ControlPlaneEnv> env = ParseControlPlaneEnv(
      "# Written by tools/controlplane.sh up; source it for the ports and paths.\n"
      "CONTROLPLANE_DIR=/tmp/cp\nETCD_PORT=1\nAPISERVER_PORT=6443\nTESSERA_PORT=8443\n"
      "TESSERA_METRICS_PORT=9395\nSCHEDULER_PORT=10259\nKUBECONFIG=/tmp/cp/kubeconfig\n");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->dir, "/tmp/cp");
  EXPECT_EQ(env->kubeconfig, "/tmp/cp/kubeconfig");
  EXPECT_EQ(env->apiserver_port, 6443);
  EXPECT_EQ(env->tessera_port, 8443);
  EXPECT_EQ(env->metrics_port, 9395);
}

TEST(ControlPlaneEnvTest, AMissingPortIsAnError) {
  absl::StatusOr<ControlPlaneEnv> env =
      ParseControlPlaneEnv("KUBECONFIG=/k\nAPISERVER_PORT=1\nTESSERA_PORT=2\n");
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()), HasSubstr("TESSERA_METRICS_PORT"));
}

TEST(FindControlPlaneScriptTest, FlagThenCandidatesAndAClearError) {
  const std::string dir = TempDir();
  const std::string script = dir + "/controlplane.sh";
  std::ofstream(script) << "#!/bin/bash\n";
  // The flag wins; a flag naming no file is an error naming it.
  EXPECT_EQ(*FindControlPlaneScript(script, {"/nonexistent/a"}), script);
  absl::StatusOr<std::string> bad = FindControlPlaneScript(dir + "/nope.sh", {script});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(dir + "/nope.sh"));
  // Without the flag: the first candidate that exists.
  EXPECT_EQ(*FindControlPlaneScript("", {"/nonexistent/a", script}), script);
  absl::StatusOr<std::string> none =
      FindControlPlaneScript("", {"/nonexistent/a", "/nonexistent/b"});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("/nonexistent/a, /nonexistent/b"));
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("--controlplane-script"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(RunCommandTest, ExitCodeAndOutputInTheLog) {
  const std::string dir = TempDir();
  const std::string log = dir + "/log";
  absl::StatusOr<int> rc =
      RunCommand({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, log, absl::Seconds(10));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 3);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("out\n"));
  EXPECT_THAT(text, HasSubstr("err\n"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(RunCommandTest, APastDeadlineRunIsKilledWithItsChildren) {
  const std::string dir = TempDir();
  const std::string pidfile = dir + "/child.pid";
  const absl::Time t0 = absl::Now();
  // The shell starts a child that would outlive it; the whole process group goes.
  absl::StatusOr<int> rc =
      RunCommand({"/bin/sh", "-c", "sleep 30 & echo $! > " + pidfile + "; wait"}, dir + "/log",
                 absl::Milliseconds(500));
  ASSERT_FALSE(rc.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(rc.status())) << rc.status();
  EXPECT_THAT(std::string(rc.status().message()), HasSubstr("/bin/sh -c sleep 30"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  std::ifstream in(pidfile);
  int child = 0;
  in >> child;
  ASSERT_GT(child, 0);
  const bool gone = ::tessera::testing::Eventually(
      [&] {
        std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
        std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        return s.empty() || s.find(") Z") != std::string::npos;
      },
      absl::Seconds(2), absl::Milliseconds(20));
  EXPECT_TRUE(gone) << "the child " << child << " survived the deadline";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(RunCommandTest, AnInterruptKillsTheRun) {
  // The run has begun once its shell has written `started`.
  const std::string dir = TempDir();
  const std::string started = dir + "/started";
  std::atomic<bool> interrupt{false};
  std::thread t([&] {
    EXPECT_TRUE(::tessera::testing::Eventually([&] { return std::filesystem::exists(started); }));
    interrupt = true;
  });
  const absl::Time t0 = absl::Now();
  absl::StatusOr<int> rc = RunCommand({"/bin/sh", "-c", "touch " + started + "; sleep 30"},
                                      "/dev/null", absl::Seconds(60), &interrupt);
  t.join();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ASSERT_FALSE(rc.ok());
  EXPECT_TRUE(absl::IsCancelled(rc.status())) << rc.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
}

TEST(RunCommandTest, AMissingProgramIsAnError) {
  absl::StatusOr<int> rc = RunCommand({"/nonexistent/program"}, "/dev/null", absl::Seconds(5));
  // posix_spawn reports the failure either at once or as exit 127 of the child.
  EXPECT_TRUE(!rc.ok() || *rc == 127) << (rc.ok() ? std::to_string(*rc) : rc.status().ToString());
}

}  // namespace
}  // namespace tessera::sim
