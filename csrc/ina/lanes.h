// Lane formats: how the elements of an all-reduce travel in the switch's lanes. One struct
// per format (the switch's program adds one format; agents/ina/packet.py LANE_FORMAT names
// it); the packetizer takes the format as a parameter, so another format (16-bit lanes) is
// one more constant here and a case in Encode/Decode.
//
// Exactness: the switch adds lanes with two's-complement wrap-around modulo 2^lane_bits.
// An integer element of b <= lane_bits bits, sign- or zero-extended into its lane, sums to
// the lane value whose low b bits are the element sum modulo 2^b: exactly what NCCL's
// integer sum computes (it wraps too). Wider integers lose their carries and floating point
// is not associative in the lanes' fixed point: neither is exact, so `Exact` says no and
// NCCL keeps its own algorithms for them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heroserve/ina_wire.h"

namespace heroserve::ina {

enum class LaneKind : uint8_t { kInt32 };

struct LaneFormat {
  LaneKind kind;
  const char* name;     // agents/ina/packet.py LANE_FORMAT for the switch's format
  uint32_t lane_bits;   // width of one lane
  uint32_t lanes;       // lanes per packet
  uint32_t payload_len() const { return HEADER_LEN + lanes * (lane_bits / 8); }
};

inline constexpr LaneFormat kInt32Lanes{LaneKind::kInt32, "int32", 32, VECTOR_LEN};

// The element types the packetizer knows (a subset of ncclDataType_t; the plugin maps).
enum class ElemType : uint8_t { kInt8, kUint8, kInt32, kUint32, kOther };

inline uint32_t ElemBits(ElemType t) {
  switch (t) {
    case ElemType::kInt8:
    case ElemType::kUint8:
      return 8;
    case ElemType::kInt32:
    case ElemType::kUint32:
      return 32;
    case ElemType::kOther:
      break;
  }
  return 0;
}

// Whether a sum of `t` travels exactly in `f` (the one rule reduceSupport follows).
inline bool Exact(const LaneFormat& f, ElemType t) {
  return t != ElemType::kOther && ElemBits(t) <= f.lane_bits;
}

// Elements per packet: one element per lane.
inline uint32_t ElemsPerPacket(const LaneFormat& f) { return f.lanes; }

// Writes `n` (<= f.lanes) elements of `src` into the lanes at `out` (big-endian), the
// remaining lanes 0.
void EncodeLanes(const LaneFormat& f, ElemType t, const void* src, size_t n, uint8_t* out);

// Reads the first `n` lanes at `in` back into `n` elements at `dst`.
void DecodeLanes(const LaneFormat& f, ElemType t, const uint8_t* in, size_t n, void* dst);

}  // namespace heroserve::ina
