#include "tessera/sim/child_processes.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include <fmt/core.h>

#include "tessera/apisim/tls.h"
#include "tessera/base/status_macros.h"

namespace tessera::sim {
namespace {

std::string RandomHex(std::mt19937_64& rng, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) {
    s += fmt::format("{:02x}", static_cast<unsigned>(rng() & 0xff));
  }
  return s;
}

// "... (port N) ..." → N, the `which`-th occurrence.
int PortOf(const std::string& line, int which) {
  size_t pos = 0;
  for (int i = 0; i <= which; ++i) {
    pos = line.find("(port ", pos);
    if (pos == std::string::npos) {
      return 0;
    }
    pos += 6;
  }
  return std::atoi(line.c_str() + pos);
}

}  // namespace

absl::Status WriteWorkFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  return out ? absl::OkStatus() : absl::InternalError("cannot write " + path);
}

ChildProcesses::ChildProcesses(std::string binary, std::string work_dir)
    : binary_(std::move(binary)), work_dir_(std::move(work_dir)) {}

absl::Status ChildProcesses::Start(const std::vector<std::string>& serve_extra) {
  MutexLock l(&mutex_);
  std::string token;
  {
    std::random_device rd;
    std::mt19937_64 tr(rd());
    token = RandomHex(tr, 16);
  }
  TESSERA_ASSIGN_OR_RETURN(apisim::PemPair pem, apisim::GenerateSelfSignedCert());
  TESSERA_RETURN_IF_ERROR(WriteWorkFile(work_dir_ + "/apisim.crt", pem.cert_pem));
  TESSERA_RETURN_IF_ERROR(WriteWorkFile(work_dir_ + "/apisim.key", pem.key_pem));
  std::remove((work_dir_ + "/apisim.state").c_str());
  apisim_args_ = {"apisim",
                  "--listen",
                  "127.0.0.1:0",
                  "--tls-cert",
                  work_dir_ + "/apisim.crt",
                  "--tls-key",
                  work_dir_ + "/apisim.key",
                  "--token",
                  token,
                  "--state",
                  work_dir_ + "/apisim.state",
                  "--watch-history",
                  "50000",
                  "--write-kubeconfig",
                  work_dir_ + "/kubeconfig"};
  TESSERA_RETURN_IF_ERROR(StartApisim(false));

  serve_args_ = {"serve",       "--kubeconfig", work_dir_ + "/kubeconfig",
                 "--http_bind", "127.0.0.1:0",  "--metrics-bind-address",
                 "127.0.0.1:0"};
  // serve runs with its default --reservation-ttl (5m): since a relist ends the reservations of
  // pods it does not return, a shorter TTL is no longer needed to bound them (docs/simulate.md,
  // "Findings" 1).
  serve_args_.insert(serve_args_.end(), serve_extra.begin(), serve_extra.end());
  // Tessera starts on an empty cluster; the nodes appear while it watches.
  return StartServe(false);
}

absl::Status ChildProcesses::RestartApisim() {
  MutexLock l(&mutex_);
  apisim_.Stop();
  return StartApisim(true);
}

void ChildProcesses::KillServe() {
  MutexLock l(&mutex_);
  serve_.Kill();
}

absl::Status ChildProcesses::RestartServe() {
  MutexLock l(&mutex_);
  return StartServe(true);
}

void ChildProcesses::EnsureServe() {
  MutexLock l(&mutex_);
  if (!serve_.running()) {
    (void)StartServe(true);
  }
}

void ChildProcesses::StopServe() {
  MutexLock l(&mutex_);
  serve_.Stop();
}

void ChildProcesses::StopApisim() {
  MutexLock l(&mutex_);
  apisim_.Stop();
}

int ChildProcesses::http_port() {
  MutexLock l(&mutex_);
  return http_port_;
}

int ChildProcesses::metrics_port() {
  MutexLock l(&mutex_);
  return metrics_port_;
}

absl::Status ChildProcesses::StartApisim(bool restart) {
  const std::string log = work_dir_ + "/apisim.log";
  absl::StatusOr<std::string> line;
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::vector<std::string> args = apisim_args_;
    if (restart) {
      args[2] = fmt::format("127.0.0.1:{}", apisim_port_);
    }
    line = apisim_.Start(binary_, args, log);
    if (line.ok() || !restart) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));  // the port may still be held for a moment
  }
  if (!line.ok()) {
    return absl::FailedPreconditionError("tessera apisim: " + std::string(line.status().message()));
  }
  const size_t colon = line->rfind(':');
  apisim_port_ = colon == std::string::npos ? 0 : std::atoi(line->c_str() + colon + 1);
  if (apisim_port_ <= 0) {
    return absl::FailedPreconditionError("tessera apisim printed an unexpected line: " + *line);
  }
  return absl::OkStatus();
}

absl::Status ChildProcesses::StartServe(bool restart) {
  const std::string log = work_dir_ + "/serve.log";
  absl::StatusOr<std::string> line;
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::vector<std::string> args = serve_args_;
    if (restart) {
      for (size_t i = 0; i + 1 < args.size(); ++i) {
        if (args[i] == "--http_bind") {
          args[i + 1] = fmt::format("127.0.0.1:{}", http_port_);
        }
        if (args[i] == "--metrics-bind-address") {
          args[i + 1] = fmt::format("127.0.0.1:{}", metrics_port_);
        }
      }
    }
    line = serve_.Start(binary_, args, log);
    if (line.ok() || !restart) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!line.ok()) {
    return absl::FailedPreconditionError("tessera serve: " + std::string(line.status().message()));
  }
  http_port_ = PortOf(*line, 0);
  metrics_port_ = PortOf(*line, 1);
  if (http_port_ <= 0 || metrics_port_ <= 0) {
    return absl::FailedPreconditionError("tessera serve printed an unexpected line: " + *line);
  }
  return absl::OkStatus();
}

}  // namespace tessera::sim
