#include "lanes.h"

#include <cstring>

namespace heroserve::ina {
namespace {

inline uint32_t LaneValue(ElemType t, const uint8_t* src, size_t i) {
  switch (t) {
    case ElemType::kInt8:
      return static_cast<uint32_t>(static_cast<int32_t>(reinterpret_cast<const int8_t*>(src)[i]));
    case ElemType::kUint8:
      return src[i];
    case ElemType::kInt32:
    case ElemType::kUint32: {
      uint32_t v;
      std::memcpy(&v, src + 4 * i, 4);
      return v;
    }
    case ElemType::kOther:
      break;
  }
  return 0;
}

inline void StoreElem(ElemType t, uint32_t lane, uint8_t* dst, size_t i) {
  switch (t) {
    case ElemType::kInt8:
    case ElemType::kUint8:
      dst[i] = static_cast<uint8_t>(lane);  // the low 8 bits: the sum modulo 2^8
      return;
    case ElemType::kInt32:
    case ElemType::kUint32:
      std::memcpy(dst + 4 * i, &lane, 4);
      return;
    case ElemType::kOther:
      break;
  }
}

}  // namespace

void EncodeLanes(const LaneFormat& f, ElemType t, const void* src, size_t n, uint8_t* out) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (f.kind) {
    case LaneKind::kInt32:
      for (size_t i = 0; i < f.lanes; i++) {
        uint32_t v = i < n ? LaneValue(t, s, i) : 0;
        out[4 * i] = static_cast<uint8_t>(v >> 24);
        out[4 * i + 1] = static_cast<uint8_t>(v >> 16);
        out[4 * i + 2] = static_cast<uint8_t>(v >> 8);
        out[4 * i + 3] = static_cast<uint8_t>(v);
      }
      return;
  }
}

void DecodeLanes(const LaneFormat& f, ElemType t, const uint8_t* in, size_t n, void* dst) {
  auto* d = static_cast<uint8_t*>(dst);
  switch (f.kind) {
    case LaneKind::kInt32:
      for (size_t i = 0; i < n && i < f.lanes; i++) {
        uint32_t v = static_cast<uint32_t>(in[4 * i]) << 24 |
                     static_cast<uint32_t>(in[4 * i + 1]) << 16 |
                     static_cast<uint32_t>(in[4 * i + 2]) << 8 | in[4 * i + 3];
        StoreElem(t, v, d, i);
      }
      return;
  }
}

}  // namespace heroserve::ina
