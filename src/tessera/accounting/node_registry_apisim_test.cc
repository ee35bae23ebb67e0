// HandshakeWriter against an in-process apisim (127.0.0.1, port 0): the registry's Requesting_
// patch lands on the node, a patch with a stale resourceVersion is a 409 the writer reports as a
// conflict (and the node keeps the newer value), a missing node is NotFound, and a follower
// writes nothing.
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/accounting/node_registry.h"
#include "tessera/base/clock.h"
#include "tessera/device/codec.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/transport.h"
#include "tessera/ledger/ledger.h"
#include "tessera/testing/apisim_env.h"

namespace tessera::accounting {
namespace {

constexpr char kHs[] = "hami.io/node-handshake";

class RegistryApisimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(env_.Start({.server = {}, .max_attempts = 0}));
    client_ = env_.client();
  }

  void CreateNode(const std::string& name, const std::string& reg, const std::string& hs) {
    env_.CreateNode(name, nlohmann::json({{"hami.io/node-nvidia-register", reg},
                                          {"hami.io/node-handshake", hs}})
                              .dump());
  }

  ::tessera::testing::ApisimEnv env_;  // default retries, as HandshakeWriter's client has
  kube::ApiClient* client_ = nullptr;
};

TEST_F(RegistryApisimTest, RequestingLandsAndAStaleResourceVersionIsAConflict) {
  const absl::Time t0 = absl::FromUnixSeconds(1800000000);
  CreateNode("g1",
             "GPU-a,10,7680,100,NVIDIA-Tesla P4,0,true:", device::FormatHandshakeReported(t0));
  absl::StatusOr<kube::Node> node = client_->GetNode("g1");
  ASSERT_TRUE(node.ok()) << node.status();

  std::unique_ptr<device::Vendor> vendor = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger;
  NodeRegistry registry(vendor.get(), &ledger, {});
  std::vector<NodePatch> patches = registry.Observe(*node, t0);
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0].resource_version, node->meta.resource_version);

  HandshakeWriter writer(client_);
  EXPECT_EQ(writer.Write(patches[0]), HandshakeWriter::Outcome::kWritten);
  absl::StatusOr<kube::Node> after = client_->GetNode("g1");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->meta.annotations.Get(kHs), "Requesting_2027-01-15 08:00:00");
  EXPECT_NE(after->meta.resource_version, node->meta.resource_version);
  // The register annotation is untouched.
  EXPECT_EQ(after->meta.annotations.Get("hami.io/node-nvidia-register"),
            "GPU-a,10,7680,100,NVIDIA-Tesla P4,0,true:");

  // The same patch again carries the old resourceVersion: 409, reported as a conflict, and the
  // node is not changed.
  NodePatch stale = patches[0];
  stale.value = "Deleted_2027-01-15 08:05:00";
  EXPECT_EQ(writer.Write(stale), HandshakeWriter::Outcome::kConflict);
  EXPECT_EQ(writer.conflicts(), 1u);
  EXPECT_EQ(client_->GetNode("g1")->meta.annotations.Get(kHs), "Requesting_2027-01-15 08:00:00");

  // The registry, observing the node as it now is, asks for nothing more.
  EXPECT_TRUE(registry.Observe(*after, t0 + absl::Seconds(1)).empty());

  // A node that is gone, and a follower.
  EXPECT_EQ(writer.Write(NodePatch{"nope", kHs, "x", ""}), HandshakeWriter::Outcome::kNotFound);
  HandshakeWriter follower(client_, {.is_leader = [] { return false; }});
  HandshakeWriter::Summary s = follower.WriteAll({NodePatch{"g1", kHs, "Requesting_x", ""}});
  EXPECT_EQ(s.skipped, 1u);
  EXPECT_EQ(client_->GetNode("g1")->meta.annotations.Get(kHs), "Requesting_2027-01-15 08:00:00");
  EXPECT_EQ(writer.written(), 1u);
  EXPECT_EQ(writer.failures(), 0u);
}

}  // namespace
}  // namespace tessera::accounting
