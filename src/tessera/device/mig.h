// File: tessera/device/mig.h
//
// The MIG wire formats of HAMi v2.10's dynamic MIG (docs/mig.md, docs/wire-formats.md):
// - the `migProfiles` value of a JSON node registration (one MigProfile per allowed profile);
// - `hami.io/vgpu-mig-allocations`, the scheduler's reservation of one placement per MIG device,
//   completed by the device plugin with the instance's runtime identity;
// - the profile-name rule of the device config's `migProfileAllowlist`.
// v2.5.2's `<uuid>[t-s]` device suffix is read by DecodePodDevices (codec.h), never written.
//
// Every decoder is total: a value or an InvalidArgument error that names the element and the
// field. Encoders write what Go's encoding/json writes for HAMi's structs, byte for byte.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/device/model.h"

namespace tessera::device {

// The annotation the scheduler writes in its filter patch (HAMi v2.10 MigAllocationsAnnotation).
inline constexpr std::string_view kMigAllocationsAnnotation = "hami.io/vgpu-mig-allocations";

// ---- migProfiles (in hami.io/node-nvidia-register) -------------------------------------------

// Decodes the JSON array of a registration's migProfiles key: objects with keys name, memoryMB,
// core, sliceCount, placements [{start, size}] (keys ASCII-case-insensitive and unknown keys
// ignored, null and omitted keys Go zero values, as Go's encoding/json). JSON null is an empty
// list. Numbers must be integers: memoryMB and core in int32, sliceCount/start/size in uint32.
// Errors (InvalidArgument) name the profile and field: `migProfiles 1: field core: ...`.
absl::StatusOr<std::vector<MigProfile>> DecodeMigProfiles(std::string_view json);

// Appends the profiles as the v2.10 plugin marshals them: keys in the order name, memoryMB,
// core, sliceCount, placements, none omitted; an empty placement list is `[]`.
void AppendMigProfilesJson(std::string* out, const std::vector<MigProfile>& profiles);

// ---- hami.io/vgpu-mig-allocations ------------------------------------------------------------

// One reserved MIG device: the placement of `profile` on the card `gpu_uuid`, for device
// `device_index` of container `container_index` (init containers first). The plugin adds the
// three runtime fields once the instance exists; all three or none are set.
struct MigAllocation {
  int32_t container_index = 0;
  int32_t device_index = 0;
  std::string gpu_uuid;
  std::string profile;
  MigPlacement placement;
  std::string mig_uuid;  // "" until realised
  std::optional<uint32_t> gpu_instance_id;
  std::optional<uint32_t> compute_instance_id;

  // The plugin realised the instance (HAMi's RuntimeReady).
  bool RuntimeReady() const {
    return !mig_uuid.empty() && gpu_instance_id.has_value() && compute_instance_id.has_value();
  }
  friend bool operator==(const MigAllocation&, const MigAllocation&) = default;
};

// A device's MIG reservation (what the fit chose), parallel to PodDevices: reservations[c][d]
// belongs to devices[c][d]; nullopt for a device that is not a MIG instance.
struct MigReservation {
  std::string profile;
  MigPlacement placement;
  friend bool operator==(const MigReservation&, const MigReservation&) = default;
};
using PodMigReservations = std::vector<std::vector<std::optional<MigReservation>>>;

// The annotation's entries as HAMi v2.10's EncodeMigAllocations builds them from a pod's
// devices: one per device with a reservation of non-empty profile and non-zero size, in
// container then device order; containerIndex and deviceIndex are its position in `devices`
// (init containers first), gpuUUID the device's (plain card) UUID. Reservations beyond the
// shape of `devices` are ignored; missing ones count as none.
std::vector<MigAllocation> MigAllocationsOf(const PodDevices& devices,
                                            const PodMigReservations& reservations);

// Decodes the annotation with HAMi v2.10's rules (DecodeMigAllocations): "" is no allocation;
// otherwise a JSON array of objects (keys as Go matches them, unknown keys ignored). Errors
// (InvalidArgument), each naming the element i (0-based): not JSON or wrong types; a negative
// index, an empty gpuUUID or profile, or placement size 0 ("MIG allocation i is incomplete"); one
// or two of migUUID/gpuInstanceID/computeInstanceID ("partial runtime identity"); a repeated
// (containerIndex, deviceIndex) pair ("duplicate MIG allocation for container c device d").
absl::StatusOr<std::vector<MigAllocation>> DecodeMigAllocations(std::string_view value);

// Compact JSON as HAMi's EncodeMigAllocations: fields in the order containerIndex, deviceIndex,
// gpuUUID, profile, placement{start,size}, then migUUID, gpuInstanceID, computeInstanceID only
// when set (an id of 0 is written). An empty list encodes as "" (the annotation is not written).
std::string EncodeMigAllocations(const std::vector<MigAllocation>& allocations);

// ---- migProfileAllowlist ---------------------------------------------------------------------

// HAMi's profile-name check (ValidateMigProfileAllowlist): the text before the first '.' has at
// least 2 characters and ends in 'g', and a '.' exists ("1g.5gb", "7g.40gb"). Returns the
// InvalidArgument error `invalid MIG profile "<name>"` otherwise.
absl::Status ValidateMigProfileName(std::string_view name);

// The compute slices a profile name asks for: the number before "g." ("3g.20gb" -> 3), or 0
// when the name has no such number.
uint32_t MigProfileComputeSlices(std::string_view name);

}  // namespace tessera::device
