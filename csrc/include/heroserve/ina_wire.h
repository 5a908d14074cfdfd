// The INA wire protocol in C++: the one C++ copy of agents/ina/packet.py's constants (the
// Python module is the definition; docs/dataplane.md explains them) and the 16-byte header
// codec. tests/agents/collnet/test_wire_constants.py parses the `inline constexpr` lines
// below and asserts each equals the Python constant of the same name, so keep every value a
// literal and every name the Python one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace heroserve::ina {

inline constexpr uint32_t INA_UDP_PORT = 48879;  // 0xBEEF
inline constexpr uint32_t VECTOR_LEN = 32;       // 32-bit words of lanes per packet
inline constexpr uint32_t VECTOR_BYTES = 128;    // lanes, whatever the format
inline constexpr const char* DEFAULT_LANE_FORMAT = "int32";
// The lane formats (packet.py LANE_FORMATS; docs/dataplane.md "Lane formats").
inline constexpr uint32_t INT32_LANES = 32;
inline constexpr uint32_t BFP16_LANES = 64;
inline constexpr uint32_t INT32_SUM_BITS = 30;
inline constexpr uint32_t BFP16_SUM_BITS = 14;
inline constexpr uint32_t FLAG_BFP16 = 0x10;
inline constexpr uint32_t FLAG_OVERFLOW = 0x08;
inline constexpr int EXP_BIAS = 127;
inline constexpr int EXP_MIN = -127;
inline constexpr int EXP_MAX = 127;
inline constexpr uint32_t EXP_BAD = 0xFF;
inline constexpr uint32_t HEADER_LEN = 16;
inline constexpr uint32_t PAYLOAD_LEN = 144;  // HEADER_LEN + VECTOR_BYTES
inline constexpr uint32_t MAX_WORKERS = 32;
inline constexpr uint32_t MAX_GROUP_ID = 65535;
inline constexpr uint32_t MAX_AGGREGATOR_SLOTS = 65536;
inline constexpr uint32_t FLAG_VERSION = 0x80;
inline constexpr uint32_t FLAG_RETX = 0x40;
inline constexpr uint32_t FLAG_RESULT = 0x20;
inline constexpr uint32_t FLAG_RESERVED = 0x07;
inline constexpr uint64_t GENERATIONS = 4294967296;
inline constexpr uint64_t SESSIONS = 4294967296;

// The header's fields (agents/ina/packet.py HEADER_STRUCT "!HHBBBBII": group_id, agg_index,
// worker_id, num_workers, flags, exp byte, session, generation; big-endian).
struct Header {
  uint16_t group_id = 0;
  uint16_t agg_index = 0;
  uint8_t worker_id = 0;
  uint8_t num_workers = 0;
  uint8_t version = 0;  // 0 or 1: which shadow copy
  bool is_retx = false;
  bool is_result = false;
  bool bfp16 = false;     // lane format bit: int16 lanes with the exp byte's exponent
  bool overflow = false;  // bfp16 results: a lane's sum saturated
  uint8_t exp = 0;        // bfp16: EXP_BIAS + block exponent, or EXP_BAD; int32: 0
  uint32_t session = 0;
  uint32_t generation = 0;

  uint8_t flags() const {
    return static_cast<uint8_t>((version ? FLAG_VERSION : 0) | (is_retx ? FLAG_RETX : 0) |
                                (is_result ? FLAG_RESULT : 0) | (bfp16 ? FLAG_BFP16 : 0) |
                                (overflow ? FLAG_OVERFLOW : 0));
  }
};

// InaHeader.at_round: round r of an aggregator travels as version r % 2 and generation
// (first_generation + r / 2) mod 2^32.
inline Header AtRound(uint16_t group_id, uint16_t agg_index, uint8_t worker_id,
                      uint8_t num_workers, uint64_t round, bool is_retx, uint32_t session,
                      uint32_t first_generation) {
  Header h;
  h.group_id = group_id;
  h.agg_index = agg_index;
  h.worker_id = worker_id;
  h.num_workers = num_workers;
  h.version = static_cast<uint8_t>(round & 1);
  h.is_retx = is_retx;
  h.session = session;
  h.generation = static_cast<uint32_t>(first_generation + (round >> 1));  // wraps mod 2^32
  return h;
}

inline void EncodeHeader(const Header& h, uint8_t* p) {
  p[0] = static_cast<uint8_t>(h.group_id >> 8);
  p[1] = static_cast<uint8_t>(h.group_id);
  p[2] = static_cast<uint8_t>(h.agg_index >> 8);
  p[3] = static_cast<uint8_t>(h.agg_index);
  p[4] = h.worker_id;
  p[5] = h.num_workers;
  p[6] = h.flags();
  p[7] = h.bfp16 ? h.exp : 0;
  for (int i = 0; i < 4; i++) {
    p[8 + i] = static_cast<uint8_t>(h.session >> (24 - 8 * i));
    p[12 + i] = static_cast<uint8_t>(h.generation >> (24 - 8 * i));
  }
}

// packet.py reserved_bits_set: a reserved flag bit, an exp byte on an int32 packet, or the
// overflow flag on anything but a bfp16 result.
inline bool ReservedBitsSet(uint8_t flags, uint8_t exp) {
  const bool bfp16 = (flags & FLAG_BFP16) != 0;
  return (flags & FLAG_RESERVED) != 0 || (!bfp16 && exp != 0) ||
         ((flags & FLAG_OVERFLOW) != 0 && !(bfp16 && (flags & FLAG_RESULT) != 0));
}

// False when shorter than a header or a reserved bit is set (the switch drops those too).
inline bool DecodeHeader(const uint8_t* p, size_t n, Header* h) {
  if (n < HEADER_LEN) return false;
  if (ReservedBitsSet(p[6], p[7])) return false;
  h->group_id = static_cast<uint16_t>(p[0] << 8 | p[1]);
  h->agg_index = static_cast<uint16_t>(p[2] << 8 | p[3]);
  h->worker_id = p[4];
  h->num_workers = p[5];
  h->version = (p[6] & FLAG_VERSION) ? 1 : 0;
  h->is_retx = (p[6] & FLAG_RETX) != 0;
  h->is_result = (p[6] & FLAG_RESULT) != 0;
  h->bfp16 = (p[6] & FLAG_BFP16) != 0;
  h->overflow = (p[6] & FLAG_OVERFLOW) != 0;
  h->exp = p[7];
  h->session = 0;
  h->generation = 0;
  for (int i = 0; i < 4; i++) {
    h->session = h->session << 8 | p[8 + i];
    h->generation = h->generation << 8 | p[12 + i];
  }
  return true;
}

}  // namespace heroserve::ina
