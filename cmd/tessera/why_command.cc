// `tessera why NS/POD`: the verdict Tessera left on a pending pod (tessera.io/verdict), read with
// a namespace user's rights (GET of that pod), and with --server a live replay of its filter with
// what-ifs from serve's /debug/why. docs/explain.md "tessera why".
//
// What it prints comes from text others wrote (the annotation is the pod owner's to set, the
// answers are the servers'), so every string is escaped for the terminal (explain/terminal.h),
// and each server gets --request-timeout in all, retries included.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/clock.h"
#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/explain/terminal.h"
#include "tessera/extender/verdict.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/transport.h"

namespace tessera::cmd {
namespace {

struct WhyOptions {
  std::string pod_arg;     // NAMESPACE/NAME or NAME
  std::string namespace_;  // -n
  std::string kubeconfig;
  std::string context;
  std::string server;  // serve's metrics listener, "http://host:9395"
  std::string if_deleted;
  std::string node;
  int32_t gpumem = 0;
  std::string output = "text";
  std::string request_timeout = "30s";
  Clock* clock = Clock::Real();  // the request deadline and "now"
};

int Fail(const absl::Status& status, int code = kExitUsage) {
  fmt::print(stderr, "tessera why: {}\n",
             explain::EscapeForTerminal(std::string(status.message()), explain::Newlines::kKeep));
  return code;
}

// One GET over `transport`, retried as kube::Do retries (5xx, 429, transport errors), all within
// `timeout`: each attempt gets what is left of it and no retry starts past it. The body of a
// 200, else the error (with the server's text); a request that ran out of time says so.
absl::StatusOr<std::string> Get(kube::Transport& transport, std::string path,
                                absl::Duration timeout, Clock* clock) {
  kube::Request request;
  request.path = std::move(path);
  const absl::Time deadline = clock->Now() + timeout;
  kube::Retrier retrier(kube::RetryPolicy(), request.method);
  auto out_of_time = [&](const absl::Status& last) {
    return absl::DeadlineExceededError(fmt::format("no answer within {} (--request-timeout): {}",
                                                   absl::FormatDuration(timeout),
                                                   std::string(last.message())));
  };
  while (true) {
    request.timeout = deadline - clock->Now();
    absl::StatusOr<kube::Response> outcome = transport.Perform(request);
    if (outcome.ok() && outcome->status_code == 200) {
      return std::move(outcome->body);
    }
    const absl::Status error = outcome.ok() ? kube::ApiError(request, *outcome) : outcome.status();
    if (outcome.ok() && outcome->status_code / 100 == 2) {
      return error;
    }
    std::optional<absl::Duration> delay = retrier.NextDelay(outcome);
    const absl::Time now = clock->Now();
    if (!delay.has_value()) {
      return now >= deadline ? out_of_time(error) : error;
    }
    if (now + *delay >= deadline) {
      return out_of_time(error);
    }
    absl::SleepFor(*delay);
  }
}

// Every string of `v` escaped for the terminal, newlines included (FormatVerdict lays it out).
void EscapeVerdict(extender::Verdict& v) {
  auto esc = [](std::string& s) { s = explain::EscapeForTerminal(s); };
  esc(v.reason);
  for (auto& [reason, count] : v.reasons) {
    esc(reason);
  }
  if (v.nearest) {
    esc(v.nearest->node);
    esc(v.nearest->device);
    for (extender::VerdictHolder& h : v.nearest->held_by) {
      esc(h.pod);
    }
  }
  if (v.lock) {
    esc(v.lock->node);
    esc(v.lock->holder);
  }
  esc(v.blocked_by);
  esc(v.quota);
  esc(v.mig);
}

// A string field of a server's JSON answer, escaped; "" when absent or not a string.
std::string Text(const nlohmann::json& doc, const char* key) {
  auto it = doc.find(key);
  return it != doc.end() && it->is_string()
             ? explain::EscapeForTerminal(it->get_ref<const std::string&>())
             : std::string();
}

// The replay's query string: the names were checked (DNS names), only if-deleted's '/' needs
// escaping.
std::string WhyQuery(const WhyOptions& o, const std::string& ns, const std::string& name) {
  std::string q = fmt::format("/debug/why?namespace={}&name={}", ns, name);
  if (!o.if_deleted.empty()) {
    std::string pod = o.if_deleted;
    if (size_t slash = pod.find('/'); slash != std::string::npos) {
      pod.replace(slash, 1, "%2F");
    }
    q += "&if-deleted=" + pod;
  }
  if (!o.node.empty()) {
    q += "&node=" + o.node;
  }
  if (o.gpumem > 0) {
    q += fmt::format("&gpumem={}", o.gpumem);
  }
  return q;
}

// The verdict annotation of the pod document, printed for people.
std::string DescribePod(const nlohmann::json& pod, absl::Time now) {
  const nlohmann::json meta = pod.value("metadata", nlohmann::json::object());
  const std::string node = pod.value("spec", nlohmann::json::object()).value("nodeName", "");
  if (!node.empty()) {
    return fmt::format("scheduled on node {}\n", node);
  }
  const std::string raw = meta.value("annotations", nlohmann::json::object())
                              .value(std::string(device::kVerdictAnnotation), "");
  if (raw.empty()) {
    return "no verdict on the pod: Tessera has not left it without a node (not filtered yet, "
           "filtered by a follower, or not a GPU pod)\n";
  }
  absl::StatusOr<extender::Verdict> verdict = extender::DecodeVerdict(raw);
  if (!verdict.ok()) {
    return fmt::format("its {} annotation does not decode: {}\n", device::kVerdictAnnotation,
                       explain::EscapeForTerminal(std::string(verdict.status().message())));
  }
  EscapeVerdict(*verdict);
  return extender::FormatVerdict(*verdict, now);
}

// serve's replay document (/debug/why), printed for people.
std::string DescribeReplay(const nlohmann::json& doc, absl::Time now) {
  std::string out = "live replay";
  const nlohmann::json what_if = doc.value("what_if", nlohmann::json::object());
  if (!what_if.empty()) {
    out += " if";
    if (what_if.contains("if_deleted")) {
      out += fmt::format(" pod {} were deleted", Text(what_if, "if_deleted"));
    }
    if (auto gpumem = what_if.find("gpumem");
        gpumem != what_if.end() && gpumem->is_number_integer()) {
      out += fmt::format(" it asked {} MiB per device", gpumem->get<int64_t>());
    }
    if (what_if.contains("node")) {
      out += fmt::format(" only node {} were a candidate", Text(what_if, "node"));
    }
  }
  out += ":\n";
  if (doc.contains("scheduled")) {
    return out + fmt::format("scheduled on node {}\n", Text(doc, "scheduled"));
  }
  if (doc.contains("error")) {
    return out + Text(doc, "error") + "\n";
  }
  if (doc.contains("fits")) {
    return out + fmt::format("node {} fits\n", Text(doc, "fits"));
  }
  absl::StatusOr<extender::Verdict> verdict =
      extender::DecodeVerdict(doc.value("verdict", nlohmann::json()).dump());
  if (!verdict.ok()) {
    return out + explain::EscapeForTerminal(std::string(verdict.status().message())) + "\n";
  }
  EscapeVerdict(*verdict);
  return out + extender::FormatVerdict(*verdict, now);
}

int RunWhy(const WhyOptions& o) {
  absl::Duration timeout;
  if (!absl::ParseDuration(o.request_timeout, &timeout) || timeout <= absl::ZeroDuration()) {
    return Fail(absl::InvalidArgumentError(
        fmt::format("--request-timeout \"{}\" is not a positive duration such as 10s or 1m",
                    o.request_timeout)));
  }
  std::string ns = o.namespace_;
  std::string name = o.pod_arg;
  if (size_t slash = o.pod_arg.find('/'); slash != std::string::npos) {
    ns = o.pod_arg.substr(0, slash);
    name = o.pod_arg.substr(slash + 1);
    if (!o.namespace_.empty() && ns != o.namespace_) {
      return Fail(absl::InvalidArgumentError(
          fmt::format("pod \"{}\" names namespace {}, -n says {}", o.pod_arg, ns, o.namespace_)));
    }
  }
  if (!kube::IsDnsSubdomain(name) || (!ns.empty() && !kube::IsDnsLabel(ns))) {
    return Fail(absl::InvalidArgumentError(
        fmt::format("\"{}\" is not NAME or NAMESPACE/NAME of a pod", o.pod_arg)));
  }
  if (o.server.empty() && (!o.if_deleted.empty() || !o.node.empty() || o.gpumem > 0)) {
    return Fail(absl::InvalidArgumentError(
        "--if-deleted, --node and --gpumem are applied in the live replay: give --server"));
  }
  kube::KubeconfigOptions kc;
  kc.path = o.kubeconfig;
  kc.context = o.context;
  absl::StatusOr<kube::RestConfig> rest = kube::LoadKubeconfig(kc);
  if (!rest.ok()) {
    return Fail(Annotate(rest.status(), "kubeconfig"));
  }
  if (ns.empty()) {
    ns = rest->namespace_.empty() ? "default" : rest->namespace_;  // as kubectl does
  }
  rest->connect_timeout = std::min(absl::Seconds(10), timeout);
  rest->request_timeout = timeout;
  kube::CurlTransport::Options transport_options;
  transport_options.user_agent = "tessera/" TESSERA_VERSION " (why)";
  absl::StatusOr<std::unique_ptr<kube::CurlTransport>> api = kube::CurlTransport::Create(
      *rest, kube::MakeTokenSource(*rest, Clock::Real()), transport_options);
  if (!api.ok()) {
    return Fail(Annotate(api.status(), "kubeconfig"));
  }
  // Only the pod itself: a namespace user's `get pods` is enough.
  absl::StatusOr<std::string> body =
      Get(**api, fmt::format("/api/v1/namespaces/{}/pods/{}", ns, name), timeout, o.clock);
  if (!body.ok()) {
    return Fail(Annotate(body.status(), fmt::format("getting pod {}/{}", ns, name)), kExitFailure);
  }
  const nlohmann::json pod = nlohmann::json::parse(*body, nullptr, false);
  if (!pod.is_object()) {
    return Fail(absl::DataLossError("the API server's pod is not a JSON object"), kExitFailure);
  }
  std::optional<nlohmann::json> replay;
  if (!o.server.empty()) {
    kube::RestConfig serve;
    serve.server = o.server;
    serve.connect_timeout = std::min(absl::Seconds(10), timeout);
    serve.request_timeout = timeout;
    absl::StatusOr<std::unique_ptr<kube::CurlTransport>> to_serve =
        kube::CurlTransport::Create(serve, nullptr, transport_options);
    if (!to_serve.ok()) {
      return Fail(Annotate(to_serve.status(), "--server"));
    }
    absl::StatusOr<std::string> answer = Get(**to_serve, WhyQuery(o, ns, name), timeout, o.clock);
    if (!answer.ok()) {
      return Fail(Annotate(answer.status(), fmt::format("--server {}", o.server)), kExitFailure);
    }
    replay = nlohmann::json::parse(*answer, nullptr, false);
    if (!replay->is_object()) {
      return Fail(absl::DataLossError("--server's answer is not a JSON object"), kExitFailure);
    }
  }
  const absl::Time now = o.clock->Now();
  if (o.output == "json") {
    nlohmann::json out = {{"pod", ns + "/" + name}};
    const std::string node = pod.value("spec", nlohmann::json::object()).value("nodeName", "");
    if (!node.empty()) {
      out["scheduled"] = node;
    }
    const std::string raw = pod.value("metadata", nlohmann::json::object())
                                .value("annotations", nlohmann::json::object())
                                .value(std::string(device::kVerdictAnnotation), "");
    out["verdict"] = raw.empty() ? nlohmann::json() : nlohmann::json::parse(raw, nullptr, false);
    if (replay) {
      out["replay"] = *replay;
    }
    // ASCII only: every control, C1 and bidi character is a \u escape of the JSON text.
    fmt::print("{}\n", out.dump(2, ' ', true, nlohmann::json::error_handler_t::replace));
    return kExitOk;
  }
  // Each field was escaped whole; this pass catches any text that was not a field.
  fmt::print("pod {}/{}: {}", ns, name,
             explain::EscapeForTerminal(DescribePod(pod, now), explain::Newlines::kKeep));
  if (replay) {
    fmt::print("{}",
               explain::EscapeForTerminal(DescribeReplay(*replay, now), explain::Newlines::kKeep));
  }
  return kExitOk;
}

}  // namespace

void AddWhyCommand(CLI::App& app, Runner* run) {
  auto opts = std::make_shared<WhyOptions>();
  CLI::App* sub = app.add_subcommand(
      "why",
      "Why a pod is pending: the verdict Tessera wrote on it (tessera.io/verdict: nodes failed "
      "per reason, the nearest miss and who holds what it lacks, node locks, nodes without a "
      "device plugin, unhealthy devices). Needs only `get` on the pod. With --server, also a "
      "live replay of its filter by `tessera serve` (/debug/why), with what-ifs. Also a kubectl "
      "plugin: `kubectl tessera why POD -n NAMESPACE`. Exit code 0 when the pod was read, 1 when "
      "the API server or --server failed, 2 on bad input.");
  sub->add_option("pod", opts->pod_arg,
                  "NAMESPACE/NAME, or NAME (namespace from -n, else the kubeconfig context's, "
                  "else default)")
      ->required();
  sub->add_option("-n,--namespace", opts->namespace_, "The namespace of a POD given by name");
  sub->add_option("--kubeconfig", opts->kubeconfig,
                  "The kubeconfig (default: $KUBECONFIG, else ~/.kube/config)");
  sub->add_option("--context", opts->context, "The kubeconfig context to use");
  sub->add_option("--server", opts->server,
                  "tessera serve's metrics listener, e.g. http://127.0.0.1:9395 (kubectl "
                  "port-forward); asks it to replay the filter against its live ledger");
  sub->add_option("--if-deleted", opts->if_deleted,
                  "Replay as if this pod (NAME or NAMESPACE/NAME) were deleted (needs --server)");
  sub->add_option("--gpumem", opts->gpumem,
                  "Replay as if the pod asked this many MiB per device (needs --server)")
      ->check(CLI::Range(1, 1048576));
  sub->add_option("--node", opts->node,
                  "Replay with this node as the only candidate (needs --server)");
  sub->add_option("--request-timeout", opts->request_timeout,
                  "How long to wait for each server (the API server, then --server) in all, "
                  "retries included, e.g. 10s, 1m; then exit 1")
      ->capture_default_str();
  sub->add_option("-o,--output", opts->output, "Output format: text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  sub->callback([run, opts] { *run = [opts] { return RunWhy(*opts); }; });
}

}  // namespace tessera::cmd
