// Lane formats: how the elements of an all-reduce travel in the switch's lanes. One struct
// per format (agents/ina/packet.py LANE_FORMATS defines them, docs/dataplane.md "Lane
// formats"); the packetizer takes the format as a parameter.
//
// bfp16: 64 int16 lanes per packet, floats only; a block (one packet's elements) travels
// as round(x * 2^s), s = BFP16_SUM_BITS - ceil(log2 w) - E, at the exponent E the switch
// agreed as the maximum of the members' proposals in the previous round of the same
// aggregator (client.h; agents/ina/transport.py allreduce_bfp16 is the same protocol).
//
// Exactness: the switch adds lanes with two's-complement wrap-around modulo 2^lane_bits.
// An integer element of b <= lane_bits bits, sign- or zero-extended into its lane, sums to
// the lane value whose low b bits are the element sum modulo 2^b: exactly what NCCL's
// integer sum computes (it wraps too). Wider integers lose their carries: not offered.
//
// Floating point (float32, float16, bfloat16) travels as fixed point, as agents/ina/lanes.py
// does: q = round_half_even(x * 2^s) with s = SUM_BITS - ceil(log2 w) - E, where E (the
// group's largest data exponent, |x| < 2^E) is agreed by all members in one aggregation
// before the data (`kExponentLanes` one-hot lanes, the highest non-zero lane of the sum is
// E). The sum of the q is exact (|sum| < 2^31, no wrap); the error against the real sum is
// only each member's rounding, at most w / (2 * 2^s) per element, plus the final rounding
// to the element type. `Quantized` says which types; the CollNet offers them only when the
// group opts in (float_sums).
#pragma once

#include <cstddef>
#include <cstdint>

#include "heroserve/ina_wire.h"

namespace heroserve::ina {

enum class LaneKind : uint8_t { kInt32, kBfp16 };

struct LaneFormat {
  LaneKind kind;
  const char* name;     // a name of agents/ina/packet.py LANE_FORMATS
  uint32_t lane_bits;   // width of one lane
  uint32_t lanes;       // lanes per packet
  uint32_t payload_len() const { return HEADER_LEN + lanes * (lane_bits / 8); }
};

inline constexpr LaneFormat kInt32Lanes{LaneKind::kInt32, "int32", 32, INT32_LANES};
inline constexpr LaneFormat kBfp16Lanes{LaneKind::kBfp16, "bfp16", 16, BFP16_LANES};
// The format of a packet.py LANE_FORMATS name; nullptr for another name.
const LaneFormat* LaneFormatByName(const char* name);

// The element types the packetizer knows (a subset of ncclDataType_t; the plugin maps).
enum class ElemType : uint8_t {
  kInt8, kUint8, kInt32, kUint32, kFloat32, kFloat16, kBfloat16, kOther
};

inline uint32_t ElemBits(ElemType t) {
  switch (t) {
    case ElemType::kInt8:
    case ElemType::kUint8:
      return 8;
    case ElemType::kInt32:
    case ElemType::kUint32:
    case ElemType::kFloat32:
      return 32;
    case ElemType::kFloat16:
    case ElemType::kBfloat16:
      return 16;
    case ElemType::kOther:
      break;
  }
  return 0;
}

// Whether a sum of `t` travels exactly in `f` (the one rule reduceSupport follows).
inline bool IsFloat(ElemType t) {
  return t == ElemType::kFloat32 || t == ElemType::kFloat16 || t == ElemType::kBfloat16;
}
// bfp16 saturates instead of wrapping, so no integer sum is exact in it.
inline bool Exact(const LaneFormat& f, ElemType t) {
  return f.kind == LaneKind::kInt32 && t != ElemType::kOther && !IsFloat(t) &&
         ElemBits(t) <= f.lane_bits;
}
// Whether `t` can travel in `f` as fixed point with an agreed exponent (not exact).
inline bool Quantized(const LaneFormat& f, ElemType t) {
  (void)f;
  return IsFloat(t);
}

// ---- fixed point (agents/ina/lanes.py) -------------------------------------------------
inline constexpr int kExponentLanes = 2 * VECTOR_LEN;  // lanes.py EXPONENT_LANES
inline constexpr int kEMin = -32;                      // lanes.py E_MIN
inline constexpr int kEMax = kEMin + kExponentLanes - 1;
inline constexpr int kSumBits = 30;                    // lanes.py SUM_BITS
// The agreement round's vector: kExponentLanes one-hot lanes as lanes.py, then one lane
// counting members whose data cannot travel (NaN, infinity, |x| >= 2^kEMax), padded to
// whole packets. A Python member (lanes.py) sends only the first kExponentLanes.
inline constexpr int kBadDataLane = kExponentLanes;
inline constexpr int kAgreementLanes = kExponentLanes + VECTOR_LEN;

int CeilLog2(uint32_t n);
// E with max_abs < 2^E, clamped below at kEMin; false when not finite or beyond 2^kEMax.
bool ExponentOf(double max_abs, int* e);
inline int ScaleExponent(uint32_t workers, int e) { return kSumBits - CeilLog2(workers) - e; }
// Element i of `src` as a double (exact for every float type here).
double ToDouble(ElemType t, const void* src, size_t i);
// `v` rounded to the nearest `t` (ties to even, directly from the double: no double
// rounding through float), stored as element i of `dst`.
void FromDouble(ElemType t, double v, void* dst, size_t i);
// Largest |x| of `n` elements; false when one is NaN or infinite.
bool MaxAbs(ElemType t, const void* src, size_t n, double* out);

// bfp16: the exp byte a member proposes for `n` elements of `t` (EXP_BIAS + E with every
// |x| < 2^E, E clamped below at EXP_MIN; EXP_BAD for NaN, infinity or beyond 2^EXP_MAX).
uint8_t BlockExponent(ElemType t, const void* src, size_t n);
// bfp16: s for the agreed exp byte (not EXP_BAD).
inline int Bfp16ScaleExponent(uint32_t workers, uint8_t exp_byte) {
  return static_cast<int>(BFP16_SUM_BITS) - CeilLog2(workers) - (exp_byte - EXP_BIAS);
}

// Elements per packet: one element per lane.
inline uint32_t ElemsPerPacket(const LaneFormat& f) { return f.lanes; }

// Writes `n` (<= f.lanes) elements of `src` into the lanes at `out` (big-endian), the
// remaining lanes 0. Float types are scaled by 2^scale_exp and rounded (the caller makes
// sure they fit: |x| < 2^E of the agreed E).
void EncodeLanes(const LaneFormat& f, ElemType t, const void* src, size_t n, uint8_t* out,
                 int scale_exp = 0);

// Reads the first `n` lanes at `in` back into `n` elements at `dst` (floats: lane * 2^-scale_exp,
// rounded to the type).
void DecodeLanes(const LaneFormat& f, ElemType t, const uint8_t* in, size_t n, void* dst,
                 int scale_exp = 0);

}  // namespace heroserve::ina
