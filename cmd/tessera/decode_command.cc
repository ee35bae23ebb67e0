// `tessera decode`: HAMi annotation values as JSON.
#include <cstdio>
#include <memory>
#include <string>

#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/device/codec.h"

namespace tessera::cmd {
namespace {

int DecodeNodeRegisterValue(const std::string& value) {
  absl::StatusOr<device::DecodedRegister> decoded = device::DecodeNodeRegister(value);
  if (!decoded.ok()) {
    fmt::print(stderr, "tessera decode node-register: {}\n",
               std::string(decoded.status().message()));
    return kExitUsage;
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const device::DeviceInfo& d : decoded->devices) {
    out.push_back({{"id", d.id},
                   {"index", d.index},
                   {"count", d.count},
                   {"devmem", d.devmem},
                   {"devcore", d.devcore},
                   {"type", d.type},
                   {"numa", d.numa},
                   {"mode", d.mode},
                   {"health", d.health}});
  }
  fmt::print("{}\n", out.dump(2));
  return kExitOk;
}

int DecodePodDevicesValue(const std::string& value) {
  absl::StatusOr<device::PodDevices> decoded = device::DecodePodDevices(value);
  if (!decoded.ok()) {
    fmt::print(stderr, "tessera decode pod-devices: {}\n", std::string(decoded.status().message()));
    return kExitUsage;
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const device::ContainerDevices& c : *decoded) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const device::ContainerDevice& d : c) {
      list.push_back(
          {{"uuid", d.uuid}, {"type", d.type}, {"memMiB", d.usedmem}, {"cores", d.usedcores}});
    }
    out.push_back(std::move(list));
  }
  fmt::print("{}\n", out.dump(2));
  return kExitOk;
}

}  // namespace

void AddDecodeCommand(CLI::App& app, Runner* run) {
  CLI::App* sub = app.add_subcommand(
      "decode", "Decode a HAMi annotation value and print it as JSON (exit code 2 if malformed)");
  sub->require_subcommand(1);
  auto value = std::make_shared<std::string>();

  CLI::App* reg = sub->add_subcommand(
      "node-register",
      "hami.io/node-nvidia-register in either format (v2.5 delimited or v2.8+ JSON): prints the "
      "devices with HAMi's JSON registration keys");
  reg->add_option("value", *value, "The annotation value")->required();
  reg->callback([run, value] { *run = [value] { return DecodeNodeRegisterValue(*value); }; });

  CLI::App* pod = sub->add_subcommand(
      "pod-devices",
      "hami.io/vgpu-devices-allocated or -to-allocate: prints one array per container of "
      "{uuid, type, memMiB, cores}");
  pod->add_option("value", *value, "The annotation value")->required();
  pod->callback([run, value] { *run = [value] { return DecodePodDevicesValue(*value); }; });
}

}  // namespace tessera::cmd
