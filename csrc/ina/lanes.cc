#include "lanes.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace heroserve::ina {
namespace {

// IEEE-style narrow float (binary16: 10 mantissa and 5 exponent bits; bfloat16: 7 and 8)
// from a double, round to nearest, ties to even, overflow to infinity.
uint16_t NarrowFromDouble(double v, int mbits, int ebits) {
  uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const int bias = (1 << (ebits - 1)) - 1;
  const int emin = 1 - bias;
  const uint16_t inf = static_cast<uint16_t>(((1u << ebits) - 1) << mbits);
  if (std::isnan(v)) return static_cast<uint16_t>(sign | inf | (1u << (mbits - 1)));
  double a = std::fabs(v);
  if (a == 0) return sign;
  if (std::isinf(a)) return sign | inf;
  int e = 0;
  std::frexp(a, &e);
  e -= 1;  // a = 1.f * 2^e
  int q = std::max(e, emin) - mbits;  // exponent of the last mantissa bit
  double n = std::nearbyint(std::ldexp(a, -q));  // FE_TONEAREST: ties to even
  if (n >= std::ldexp(1.0, mbits + 1)) {  // rounding carried into the next binade
    n /= 2;
    q += 1;
  }
  if (n < std::ldexp(1.0, mbits)) return static_cast<uint16_t>(sign | static_cast<uint16_t>(n));
  int biased = q + mbits + bias;
  if (biased >= (1 << ebits) - 1) return sign | inf;
  return static_cast<uint16_t>(sign | biased << mbits |
                               static_cast<uint16_t>(n - std::ldexp(1.0, mbits)));
}

double NarrowToDouble(uint16_t b, int mbits, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1;
  int exp = (b >> mbits) & ((1 << ebits) - 1);
  uint32_t man = b & ((1u << mbits) - 1);
  double s = (b & 0x8000) ? -1.0 : 1.0;
  if (exp == (1 << ebits) - 1) return man ? std::nan("") : s * INFINITY;
  if (exp == 0) return s * std::ldexp(static_cast<double>(man), 1 - bias - mbits);
  return s * std::ldexp(static_cast<double>(man | 1u << mbits), exp - bias - mbits);
}

inline uint32_t LaneValue(ElemType t, const uint8_t* src, size_t i, int scale_exp) {
  switch (t) {
    case ElemType::kFloat32:
    case ElemType::kFloat16:
    case ElemType::kBfloat16: {
      double q = std::nearbyint(std::ldexp(ToDouble(t, src, i), scale_exp));
      return static_cast<uint32_t>(static_cast<int32_t>(q));
    }
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

inline void StoreElem(ElemType t, uint32_t lane, uint8_t* dst, size_t i, int scale_exp) {
  switch (t) {
    case ElemType::kFloat32:
    case ElemType::kFloat16:
    case ElemType::kBfloat16:
      FromDouble(t, std::ldexp(static_cast<double>(static_cast<int32_t>(lane)), -scale_exp), dst, i);
      return;
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

const LaneFormat* LaneFormatByName(const char* name) {
  if (std::strcmp(name, kInt32Lanes.name) == 0) return &kInt32Lanes;
  if (std::strcmp(name, kBfp16Lanes.name) == 0) return &kBfp16Lanes;
  return nullptr;
}

uint8_t BlockExponent(ElemType t, const void* src, size_t n) {
  double m = 0;
  if (!MaxAbs(t, src, n, &m)) return static_cast<uint8_t>(EXP_BAD);
  int e = EXP_MIN;
  if (m > 0) std::frexp(m, &e);  // m = f * 2^e, 0.5 <= f < 1: every |x| < 2^e
  if (e > EXP_MAX) return static_cast<uint8_t>(EXP_BAD);
  return static_cast<uint8_t>(EXP_BIAS + std::max(e, EXP_MIN));
}

int CeilLog2(uint32_t n) {
  int k = 0;
  while ((1ull << k) < n) k++;
  return k;
}

bool ExponentOf(double max_abs, int* e) {
  if (!std::isfinite(max_abs)) return false;
  int x = kEMin;
  if (max_abs > 0) std::frexp(max_abs, &x);  // max_abs = m * 2^x, 0.5 <= m < 1
  if (x > kEMax) return false;
  *e = std::max(x, kEMin);
  return true;
}

double ToDouble(ElemType t, const void* src, size_t i) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case ElemType::kFloat32: {
      float v;
      std::memcpy(&v, s + 4 * i, 4);
      return v;
    }
    case ElemType::kFloat16:
    case ElemType::kBfloat16: {
      uint16_t b;
      std::memcpy(&b, s + 2 * i, 2);
      return t == ElemType::kFloat16 ? NarrowToDouble(b, 10, 5) : NarrowToDouble(b, 7, 8);
    }
    default:
      return 0;
  }
}

void FromDouble(ElemType t, double v, void* dst, size_t i) {
  auto* d = static_cast<uint8_t*>(dst);
  switch (t) {
    case ElemType::kFloat32: {
      float f = static_cast<float>(v);  // round to nearest even
      std::memcpy(d + 4 * i, &f, 4);
      return;
    }
    case ElemType::kFloat16:
    case ElemType::kBfloat16: {
      uint16_t b = t == ElemType::kFloat16 ? NarrowFromDouble(v, 10, 5) : NarrowFromDouble(v, 7, 8);
      std::memcpy(d + 2 * i, &b, 2);
      return;
    }
    default:
      return;
  }
}

bool MaxAbs(ElemType t, const void* src, size_t n, double* out) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double a = std::fabs(ToDouble(t, src, i));
    if (!(a <= 1.7976931348623157e308)) return false;  // NaN or infinity
    m = std::max(m, a);
  }
  *out = m;
  return true;
}

void EncodeLanes(const LaneFormat& f, ElemType t, const void* src, size_t n, uint8_t* out,
                 int scale_exp) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (f.kind) {
    case LaneKind::kInt32:
      for (size_t i = 0; i < f.lanes; i++) {
        uint32_t v = i < n ? LaneValue(t, s, i, scale_exp) : 0;
        out[4 * i] = static_cast<uint8_t>(v >> 24);
        out[4 * i + 1] = static_cast<uint8_t>(v >> 16);
        out[4 * i + 2] = static_cast<uint8_t>(v >> 8);
        out[4 * i + 3] = static_cast<uint8_t>(v);
      }
      return;
    case LaneKind::kBfp16:
      for (size_t i = 0; i < f.lanes; i++) {
        // The agreed exponent bounds |x * 2^s| by 2^(BFP16_SUM_BITS - ceil(log2 w)).
        double q = i < n ? std::nearbyint(std::ldexp(ToDouble(t, s, i), scale_exp)) : 0;
        uint16_t v = static_cast<uint16_t>(static_cast<int16_t>(q));
        out[2 * i] = static_cast<uint8_t>(v >> 8);
        out[2 * i + 1] = static_cast<uint8_t>(v);
      }
      return;
  }
}

void DecodeLanes(const LaneFormat& f, ElemType t, const uint8_t* in, size_t n, void* dst,
                 int scale_exp) {
  auto* d = static_cast<uint8_t*>(dst);
  switch (f.kind) {
    case LaneKind::kInt32:
      for (size_t i = 0; i < n && i < f.lanes; i++) {
        uint32_t v = static_cast<uint32_t>(in[4 * i]) << 24 |
                     static_cast<uint32_t>(in[4 * i + 1]) << 16 |
                     static_cast<uint32_t>(in[4 * i + 2]) << 8 | in[4 * i + 3];
        StoreElem(t, v, d, i, scale_exp);
      }
      return;
    case LaneKind::kBfp16:
      for (size_t i = 0; i < n && i < f.lanes; i++) {
        auto v = static_cast<int16_t>(static_cast<uint16_t>(in[2 * i] << 8 | in[2 * i + 1]));
        FromDouble(t, std::ldexp(static_cast<double>(v), -scale_exp), d, i);
      }
      return;
  }
}

}  // namespace heroserve::ina
