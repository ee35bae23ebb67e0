// File: tessera/device/codec.h
//
// The HAMi wire codecs of the NVIDIA vendor: the values of the annotations listed in
// tessera/device/annotations.h, decoded into the shared model (tessera/device/model.h) and
// encoded back byte for byte. docs/wire-formats.md describes every format with examples, the
// encode rules, the decode tolerance and where Tessera deliberately differs from HAMi.
//
// Every decoder is total: any input yields a value or an absl::InvalidArgumentError whose
// message names what is wrong (device, container, field and the offending text). Errors never
// carry other codes. Encoders cannot fail; their preconditions are stated per function.
//
// Thread safety: every function is pure (no shared mutable state; the JSON decoder uses a
// thread-local parser) and may be called concurrently from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/device/model.h"
#include "tessera/kube/objects.h"

namespace tessera::device {

// ---- hami.io/node-nvidia-register ----------------------------------------------------------

struct DecodedRegister {
  RegisterFormat format = RegisterFormat::kJson;
  std::vector<DeviceInfo> devices;

  friend bool operator==(const DecodedRegister&, const DecodedRegister&) = default;
};

// Decodes a node registration in either format. A value whose first non-whitespace byte is
// '[' is the JSON array of v2.8+; anything else is the delimited format of v2.5–v2.7.
//
// JSON: keys are matched ASCII-case-insensitively (as Go does), unknown keys (migtemplate,
// devicevendor, …) are ignored, migProfiles is decoded by DecodeMigProfiles (mig.h), custominfo
// must be an object or null and only its NetworkID is read (DeviceInfo::network_key), null and
// omitted keys take Go zero values (index 0, count 0, numa 0, health false, …) except that an
// omitted or empty mode means "hami-core". Numbers must be integers in int32 range; index must be
// non-negative. Delimited: "id,count,devmem,devcore,type,numa,health[,index,mode]:" per device;
// segments without ',' are skipped, and at least one device must remain; a 7-field device has index
// 0 and mode "hami-core", an empty 9th field means "hami-core". Numbers follow Go strconv.Atoi
// (optional sign, decimal, no spaces) and must fit int32; a negative index is an error; health
// follows Go strconv.ParseBool.
// JSON: an empty array is an error (HAMi v2.10's NVIDIA GetNodeDevices rejects it).
// Both: every device needs a non-empty id, and ids must be unique within the node. A delimited
// id must not start with '[' (after whitespace): re-encoded first, it would read as JSON.
// Errors (InvalidArgument) name the device (0-based) and field, e.g.
// `device 2: field devmem: not an integer: "x"`.
absl::StatusOr<DecodedRegister> DecodeNodeRegister(std::string_view value);

// The delimited form, always 9 fields per device, every device terminated by ':'. An empty list
// encodes as "". Precondition: no string field contains ',' or ':' (the format cannot carry
// them) and the first id does not start with '['; DecodeNodeRegister output of a delimited value
// always satisfies it.
std::string EncodeNodeRegisterDelimited(const std::vector<DeviceInfo>& devices);

// The JSON form exactly as HAMi's plugin marshals it with Go encoding/json: keys in the order
// id,index,count,devmem,devcore,type,numa,mode,health,custominfo (only NetworkID: the number,
// or null for one that is no number),
// each omitted when zero/empty/false
// (omitempty), no whitespace, strings escaped as Go does (<, >, & as \u003c…; invalid UTF-8 as
// \ufffd). An empty list encodes as "[]".
std::string EncodeNodeRegisterJson(const std::vector<DeviceInfo>& devices);

// ---- hami.io/vgpu-devices-to-allocate and hami.io/vgpu-devices-allocated --------------------

// Encodes one entry per container, in order, each terminated by ';': a container's devices are
// "UUID,Type,usedmem,usedcores:" each; a container without devices contributes only ";". This
// is the layout every plugin generation consumes (init containers first). Devices with an
// empty UUID are never written (so a blank ",,0,0:" placeholder cannot be produced).
// Precondition: no UUID or type contains ',', ':' or ';'.
std::string EncodePodDevices(const PodDevices& devices);

// Decodes what any HAMi scheduler wrote and what the device plugin rewrote. ';' terminates a
// container entry: "A:;B:;" is two entries, "A:;;" is [A], [], and text after the last ';' is an
// entry only when it is non-empty (so "A:" is [A]). Within an entry, ':'-separated pieces without
// ',' are ignored; each remaining piece needs at least 4 fields "UUID,Type,usedmem,usedcores"
// (extra fields are ignored). Blank placeholders (",,0,0", v2.5.2 padding) hold nothing and are
// dropped, leaving their entry in place. A v2.5.2 MIG suffix "[<template>-<slot>]" at the end of
// a UUID is stripped, so the device is booked on its physical GPU.
// Errors (InvalidArgument) name the container and device (0-based), e.g.
// `container 1 device 0: usedmem: not an integer: "x"`: fewer than 4 fields, a number that is
// not a decimal int32, a negative number, an empty UUID on a non-blank device.
absl::StatusOr<PodDevices> DecodePodDevices(std::string_view value);

// ---- hami.io/mutex.lock ---------------------------------------------------------------------

struct NodeLock {
  absl::Time time;
  std::string ns;       // empty for a legacy lock
  std::string name;     // empty for a legacy lock
  bool legacy = false;  // the value was a bare time (no owner)

  friend bool operator==(const NodeLock&, const NodeLock&) = default;
};

// Parses "<RFC3339>,<namespace>,<name>" or the legacy bare "<RFC3339>". The time follows Go's
// time.Parse(time.RFC3339): "YYYY-MM-DDTHH:MM:SS", an optional fraction, then "Z" or ±hh:mm.
// Errors (InvalidArgument): a comma count other than 0 or 2, an empty namespace or name, a
// time that is not RFC 3339.
absl::StatusOr<NodeLock> ParseNodeLock(std::string_view value);

// "<time>,<ns>,<name>" with the time as Go's time.RFC3339 in UTC, e.g.
// "2026-01-02T03:04:05Z,default,gpu-pod" (sub-seconds truncated). Precondition: `time` lies in
// the years 0000–9999 UTC and ns/name contain no ','.
std::string FormatNodeLock(absl::Time time, std::string_view ns, std::string_view name);

// True when `lock` names the pod ns/name. A legacy lock is owned by nobody.
bool NodeLockOwnedBy(const NodeLock& lock, std::string_view ns, std::string_view name);

// ---- hami.io/node-handshake -----------------------------------------------------------------

enum class HandshakeKind {
  kAbsent,      // empty value
  kRequesting,  // "Requesting_<2006-01-02 15:04:05>", written by a scheduler
  kDeleted,     // "Deleted_<2006-01-02 15:04:05>", written by a v2.5–v2.9 scheduler
  kReported,    // "Reported <Go time.String()>", written by a v2.5–v2.7 plugin
  kOther,       // anything else
};

struct Handshake {
  HandshakeKind kind = HandshakeKind::kAbsent;
  // The time the value carries; nullopt when it has none or it does not parse (for example a
  // bare "Requesting"). Requesting_/Deleted_ times are read as UTC.
  std::optional<absl::Time> time;

  friend bool operator==(const Handshake&, const Handshake&) = default;
};

// Classifies a handshake value by its prefix ("Requesting", "Deleted", "Reported"). Total:
// never fails; an unparsable time leaves `time` empty.
Handshake ParseHandshake(std::string_view value);

// "Requesting_2026-01-02 03:04:05" / "Deleted_…" in UTC (sub-seconds truncated).
// Precondition: `time` lies in the years 0000–9999 UTC.
std::string FormatHandshakeRequesting(absl::Time time);
std::string FormatHandshakeDeleted(absl::Time time);
// "Reported " + Go time.Time.String() in UTC without the monotonic reading, e.g.
// "Reported 2024-01-23 04:30:04.434037031 +0000 UTC" (the v2.5.2 plugin's heartbeat; used by
// the device plugin emulator). Same precondition.
std::string FormatHandshakeReported(absl::Time time);

// ---- hami.io/device-cordon ------------------------------------------------------------------

// Splits a comma list of UUIDs, trims ASCII whitespace, skips empty entries, and returns them
// sorted and unique (the form of NodeDevices::cordoned). Total.
std::vector<std::string> ParseCordonList(std::string_view value);

// ---- User annotations -----------------------------------------------------------------------

// "binpack" or "spread" (surrounding whitespace ignored). Any other value is an
// InvalidArgument error naming it (HAMi silently falls back to binpack).
absl::StatusOr<NodePolicy> ParseNodePolicy(std::string_view value);

// A comma chain of "binpack", "spread", "numa", "mutex", "topology-aware" (HAMi v2.10), e.g.
// "binpack,numa"; tokens are trimmed, empty tokens skipped (HAMi's PolicyContains). InvalidArgument
// errors: an unknown key (HAMi falls back to spread), a repeated key, binpack together with
// spread, an empty chain.
absl::StatusOr<GpuPolicy> ParseGpuPolicy(std::string_view value);

// hami.io/numa-alignment (HAMi pkg/util/numa_alignment.go:ParseNumaAlignmentMode).
enum class NumaAlignment { kNone, kBestEffort, kStrict };
// "best-effort" or "strict", ASCII case-insensitive (and U+0130 'İ' read as 'i', as Go's
// strings.ToLower does), surrounding ASCII whitespace ignored. Anything else is an
// InvalidArgument error with HAMi's text:
// `invalid hami.io/numa-alignment annotation "<value>": expected "best-effort" or "strict"`
// (the value quoted as Quote does: the same as Go's %q for printable ASCII up to 64 bytes).
absl::StatusOr<NumaAlignment> ParseNumaAlignment(std::string_view value);

// The texts ParseNodePolicy and ParseGpuPolicy read back: "binpack", "spread,numa".
std::string NodePolicyName(NodePolicy policy);
std::string GpuPolicyName(const GpuPolicy& policy);

// Reads the pod-level constraints from a pod's annotations (keys in annotations.h), with HAMi
// v2.10 semantics: comma lists trimmed, empty tokens dropped, an empty list = no constraint;
// use- and nouse-gpuuuid both apply. A vgpu-mode or policy value that is empty after trimming
// counts as absent. numa-bind follows Go strconv.ParseBool exactly.
// InvalidArgument errors name the annotation key: numa-bind not a Go boolean, or a policy
// ParseNodePolicy/ParseGpuPolicy rejects.
absl::StatusOr<PodConstraints> ParsePodConstraints(const kube::StringMap& annotations);

}  // namespace tessera::device
