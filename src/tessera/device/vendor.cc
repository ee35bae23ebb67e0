#include "tessera/device/vendor.h"

#include <string>
#include <utility>

#include <fmt/core.h>

#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/node_scores.h"
#include "tessera/device/other_vendors.h"
#include "tessera/device/request.h"

namespace tessera::device {
namespace {

class NvidiaVendor : public Vendor {
 public:
  explicit NvidiaVendor(NvidiaConfig config) : config_(std::move(config)) {}

  std::string_view Key() const override { return kNvidiaVendor; }
  std::string_view RegisterAnnotation() const override { return kNodeRegisterAnnotation; }
  std::string_view HandshakeAnnotation() const override { return kNodeHandshakeAnnotation; }
  std::string_view ToAllocateAnnotation() const override { return kDevicesToAllocateAnnotation; }
  std::string_view AllocatedAnnotation() const override { return kDevicesAllocatedAnnotation; }

  std::vector<std::string> ManagedResources() const override {
    return {config_.resource_count_name, config_.resource_memory_name, config_.resource_core_name,
            config_.resource_memory_percentage_name, config_.resource_priority_name};
  }

  absl::StatusOr<NodeDevices> DecodeNode(const kube::Node& node) const override {
    const std::string* value = node.meta.annotations.Find(kNodeRegisterAnnotation);
    if (value == nullptr) {
      return absl::NotFoundError(
          fmt::format("node {}: no {} annotation", node.meta.name, kNodeRegisterAnnotation));
    }
    absl::StatusOr<DecodedRegister> decoded = DecodeNodeRegister(*value);
    if (!decoded.ok()) {
      return Annotate(decoded.status(),
                      fmt::format("node {}: {}", node.meta.name, kNodeRegisterAnnotation));
    }
    NodeDevices out;
    out.node = node.meta.name;
    out.format = decoded->format;
    out.devices = std::move(decoded->devices);
    if (const std::string* cordon = node.meta.annotations.Find(kDeviceCordonAnnotation)) {
      out.cordoned = ParseCordonList(*cordon);
    }
    // HAMi's GetNodeDevices: absent scores are all zeros; scores that do not decode fail the
    // node's NVIDIA registration.
    if (const std::string* scores = node.meta.annotations.Find(kNodeScoreAnnotation)) {
      absl::StatusOr<std::vector<GpuPairScores>> decoded_scores = DecodeNodeScores(*scores);
      if (!decoded_scores.ok()) {
        return Annotate(decoded_scores.status(),
                        fmt::format("node {}: {}", node.meta.name, kNodeScoreAnnotation));
      }
      out.pair_scores = PairScoreMatrix(out.devices, *decoded_scores);
    }
    return out;
  }

  absl::StatusOr<PodRequest> DecodeRequest(const kube::Pod& pod) const override {
    TESSERA_RETURN_IF_ERROR(RefuseOtherVendors(pod, config_));
    return DerivePodRequest(pod, config_);
  }

  absl::StatusOr<PodConstraints> DecodeConstraints(const kube::Pod& pod) const override {
    absl::StatusOr<PodConstraints> c = ParsePodConstraints(pod.meta.annotations);
    if (!c.ok()) {
      return Annotate(c.status(), fmt::format("pod {}", pod.Key()));
    }
    return c;
  }

  absl::StatusOr<PodDevices> DecodeAllocation(const kube::Pod& pod) const override {
    const std::string* value = pod.meta.annotations.Find(kDevicesAllocatedAnnotation);
    if (value == nullptr) {
      return absl::NotFoundError(
          fmt::format("pod {}: no {} annotation", pod.Key(), kDevicesAllocatedAnnotation));
    }
    absl::StatusOr<PodDevices> devices = DecodePodDevices(*value);
    if (!devices.ok()) {
      return Annotate(devices.status(),
                      fmt::format("pod {}: {}", pod.Key(), kDevicesAllocatedAnnotation));
    }
    return devices;
  }

  std::string EncodeAllocation(const PodDevices& devices) const override {
    return EncodePodDevices(devices);
  }

 private:
  NvidiaConfig config_;
};

}  // namespace

std::unique_ptr<Vendor> NewNvidiaVendor(NvidiaConfig config) {
  return std::make_unique<NvidiaVendor>(std::move(config));
}

kube::StringMap FilterAnnotations(const Vendor& vendor, const kube::Pod& pod, std::string_view node,
                                  const PodDevices& devices, absl::Time now,
                                  const PodMigReservations& mig) {
  kube::StringMap out;
  const std::string encoded = vendor.EncodeAllocation(devices);
  out.Set(std::string(kVgpuNodeAnnotation), std::string(node));
  out.Set(std::string(kVgpuTimeAnnotation), std::to_string(absl::ToUnixSeconds(now)));
  out.Set(std::string(vendor.ToAllocateAnnotation()), encoded);
  out.Set(std::string(vendor.AllocatedAnnotation()), encoded);
  vendor.AddFilterAnnotations(pod, devices, now, &out);
  if (std::string allocations = EncodeMigAllocations(MigAllocationsOf(devices, mig));
      !allocations.empty()) {
    out.Set(std::string(kMigAllocationsAnnotation), std::move(allocations));
  }
  return out;
}

kube::StringMap FilterLabels(std::string_view node) {
  kube::StringMap out;
  out.Set(std::string(kVgpuNodeLabel), std::string(node));
  return out;
}

}  // namespace tessera::device
