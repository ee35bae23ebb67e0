// File: tessera/device/node_scores.h
//
// The codec of hami.io/node-nvidia-score: the GPU pair scores the NVIDIA device plugin writes
// with ENABLE_TOPOLOGY_SCORE (HAMi v2.10 pkg/device/nvidia/calculate_score.go; read by
// pkg/device/nvidia/device.go:GetNodeDevices), and the per-node matrix the `topology-aware` GPU
// policy reads (NodeDevices::pair_scores, schedule/fit.h). docs/wire-formats.md has the format.
//
//   [{"uuid":"GPU-0","score":{"GPU-1":100}},{"uuid":"GPU-1","score":{"GPU-0":100}}]
//
// Errors: DecodeNodeScores returns InvalidArgument naming the entry and key; a node whose value
// does not decode has no usable registration (as in HAMi, where GetNodeDevices fails).
//
// Thread safety: pure functions; may be called concurrently from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/device/model.h"

namespace tessera::device {

// One element of the array: a card and its scores towards other cards.
struct GpuPairScores {
  std::string uuid;
  // (other card's UUID, score) in document order. A key may repeat; the last one counts.
  std::vector<std::pair<std::string, int64_t>> scores;

  friend bool operator==(const GpuPairScores&, const GpuPairScores&) = default;
};

// Decodes the annotation as Go's encoding/json decodes it into HAMi's []DevicePairScore:
// the value must be one JSON array (or `null`: no scores) of objects; keys "uuid" and "score"
// match ASCII-case-insensitively and the last occurrence counts (a repeated "score" adds to the
// same map); other keys are ignored; null is an empty element, leaves "uuid" as it was, empties
// "score" and is 0 as one score (Go's rules for null). Scores are integers in
// int64 range, negative ones included; a fraction or exponent ("1.5", "1e2") is an error, as is
// any other type, trailing content, invalid JSON or (unlike Go, which substitutes U+FFFD)
// invalid UTF-8.
absl::StatusOr<std::vector<GpuPairScores>> DecodeNodeScores(std::string_view value);

// The value as HAMi's plugin marshals it (Go encoding/json): one object per element in order,
// "uuid" omitted when empty, "score" omitted when it has no key, score keys sorted bytewise and
// unique (the last value of a repeated key), no whitespace, strings escaped as Go does.
std::string EncodeNodeScores(const std::vector<GpuPairScores>& scores);

// The matrix over `devices` (NodeDevices::pair_scores) as HAMi's Fit reads the scores: device
// i takes the scores of the FIRST element whose uuid equals its id, and its score towards device
// j is that element's value for key devices[j].id (0 when absent). Elements naming no device and
// keys naming no device are ignored. Empty when every entry of the matrix is 0, and for a node of
// more than kMaxScoredDevices devices, whose scores are ignored (all 0) so that the n² matrix
// stays small (512 KiB at most; real nodes have at most 16 GPUs).
inline constexpr size_t kMaxScoredDevices = 256;
std::vector<int64_t> PairScoreMatrix(const std::vector<DeviceInfo>& devices,
                                     const std::vector<GpuPairScores>& scores);

}  // namespace tessera::device
