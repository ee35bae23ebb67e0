// POST /webhook through the real HTTP(S) server, as kube-apiserver calls it.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include <nlohmann/json.hpp>

#include "tessera/apisim/tls.h"
#include "tessera/extender/http_server.h"
#include "tessera/extender/webhook.h"

namespace tessera::extender {
namespace {

using nlohmann::json;

// The extender routes are not exercised here.
class IdleBackend : public Backend {
 public:
  FilterResult Filter(const FilterArgs&) override { return {}; }
  BindResult Bind(const BindArgs&) override { return {}; }
  bool Ready(std::string*) override { return true; }
  std::string DebugLedgerJson() override { return "{}"; }
};

std::string ReadTestdata(const std::string& name) {
  const char* dir = std::getenv("TESSERA_SOURCE_DIR");
  std::ifstream in(std::string(dir != nullptr ? dir : ".") + "/test/testdata/webhook/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

HttpServerOptions WebhookServerOptions(const WebhookOptions& webhook) {
  HttpServerOptions options;
  options.bind_address = "127.0.0.1:0";
  options.metrics_bind_address = "";
  options.threads = 2;
  options.webhook = [webhook](std::string_view content_type, std::string_view body) {
    WebhookReply reply = HandleAdmissionReview(content_type, body, webhook);
    return std::make_pair(reply.http_status, std::move(reply.body));
  };
  return options;
}

TEST(WebhookHttpTest, MutatesOverHttp) {
  IdleBackend backend;
  HttpServer server(&backend, WebhookServerOptions({}));
  ASSERT_TRUE(server.Start().ok());
  httplib::Client c("127.0.0.1", server.port());
  const std::string body = ReadTestdata("gpumem-only.json");
  httplib::Result r = c.Post("/webhook", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  json review = json::parse(r->body);
  EXPECT_EQ(review["response"]["uid"], json::parse(body)["request"]["uid"]);
  EXPECT_TRUE(review["response"]["allowed"]);
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape(review["response"]["patch"].get<std::string>(), &patch));
  EXPECT_THAT(patch, ::testing::HasSubstr("hami-scheduler"));

  // Denials are 200 with allowed:false; malformed reviews 400; wrong methods 405.
  r = c.Post("/webhook", ReadTestdata("privileged.json"), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_FALSE(json::parse(r->body)["response"]["allowed"]);
  r = c.Post("/webhook", "{", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["response"]["status"]["code"], 400);
  r = c.Post("/webhook", body, "text/yaml");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  r = c.Get("/webhook");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  server.Stop();
}

TEST(WebhookHttpTest, ATenantsRewriteOfItsAllocationIsDeniedOverHttp) {
  // issue 41: the pod's owner patched hami.io/vgpu-devices-allocated from 12,000 MiB to 1 MiB.
  IdleBackend backend;
  WebhookOptions webhook;
  webhook.self_username = "system:serviceaccount:tessera-system:tessera";
  HttpServer server(&backend, WebhookServerOptions(webhook));
  ASSERT_TRUE(server.Start().ok());
  httplib::Client c("127.0.0.1", server.port());
  const std::string body = ReadTestdata("update-allocation-by-tenant.json");
  httplib::Result r = c.Post("/webhook", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  json response = json::parse(r->body)["response"];
  EXPECT_EQ(response["uid"], json::parse(body)["request"]["uid"]);
  EXPECT_FALSE(response["allowed"]);
  EXPECT_EQ(response["status"]["code"], 403);
  EXPECT_EQ(response["status"]["message"],
            "annotation hami.io/vgpu-devices-allocated is written by the scheduler and cannot be "
            "set by system:serviceaccount:ml:default");
  EXPECT_FALSE(response.contains("patch"));
  // The same write by the scheduler itself goes through.
  json review = json::parse(body);
  review["request"]["userInfo"]["username"] = webhook.self_username;
  r = c.Post("/webhook", review.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_TRUE(json::parse(r->body)["response"]["allowed"]);
  server.Stop();
}

TEST(WebhookHttpTest, NotServedWithoutAHandler) {
  IdleBackend backend;
  HttpServerOptions options = WebhookServerOptions({});
  options.webhook = nullptr;
  HttpServer server(&backend, options);
  ASSERT_TRUE(server.Start().ok());
  httplib::Client c("127.0.0.1", server.port());
  httplib::Result r = c.Post("/webhook", ReadTestdata("gpu-only.json"), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
}

TEST(WebhookHttpTest, ServedOverTlsOnTheExtenderListener) {
  absl::StatusOr<apisim::PemPair> pair = apisim::GenerateSelfSignedCert();
  ASSERT_TRUE(pair.ok());
  std::string dir = ::testing::TempDir() + "webhook_tls_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  std::ofstream(dir + "/tls.crt") << pair->cert_pem;
  std::ofstream(dir + "/tls.key") << pair->key_pem;
  IdleBackend backend;
  HttpServerOptions options = WebhookServerOptions({});
  options.cert_file = dir + "/tls.crt";
  options.key_file = dir + "/tls.key";
  HttpServer server(&backend, options);
  ASSERT_TRUE(server.Start().ok());
  httplib::SSLClient c("127.0.0.1", server.port());
  c.set_ca_cert_path((dir + "/tls.crt").c_str());
  c.enable_server_certificate_verification(true);
  httplib::Result r = c.Post("/webhook", ReadTestdata("v1beta1.json"), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["apiVersion"], "admission.k8s.io/v1beta1");
  server.Stop();
  std::remove((dir + "/tls.crt").c_str());
  std::remove((dir + "/tls.key").c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace tessera::extender
