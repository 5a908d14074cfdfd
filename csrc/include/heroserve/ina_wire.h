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
inline constexpr uint32_t VECTOR_LEN = 32;       // lanes per packet
inline constexpr uint32_t VECTOR_BYTES = 128;    // int32 lanes
inline constexpr const char* LANE_FORMAT = "int32";
inline constexpr uint32_t HEADER_LEN = 16;
inline constexpr uint32_t PAYLOAD_LEN = 144;  // HEADER_LEN + VECTOR_BYTES
inline constexpr uint32_t MAX_WORKERS = 32;
inline constexpr uint32_t MAX_GROUP_ID = 65535;
inline constexpr uint32_t MAX_AGGREGATOR_SLOTS = 65536;
inline constexpr uint32_t FLAG_VERSION = 0x80;
inline constexpr uint32_t FLAG_RETX = 0x40;
inline constexpr uint32_t FLAG_RESULT = 0x20;
inline constexpr uint32_t FLAG_RESERVED = 0x1F;
inline constexpr uint64_t GENERATIONS = 4294967296;
inline constexpr uint64_t SESSIONS = 4294967296;

// The header's fields (agents/ina/packet.py HEADER_STRUCT "!HHBBBBII": group_id, agg_index,
// worker_id, num_workers, flags, reserved byte, session, generation; big-endian).
struct Header {
  uint16_t group_id = 0;
  uint16_t agg_index = 0;
  uint8_t worker_id = 0;
  uint8_t num_workers = 0;
  uint8_t version = 0;  // 0 or 1: which shadow copy
  bool is_retx = false;
  bool is_result = false;
  uint32_t session = 0;
  uint32_t generation = 0;

  uint8_t flags() const {
    return static_cast<uint8_t>((version ? FLAG_VERSION : 0) | (is_retx ? FLAG_RETX : 0) |
                                (is_result ? FLAG_RESULT : 0));
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
  p[7] = 0;
  for (int i = 0; i < 4; i++) {
    p[8 + i] = static_cast<uint8_t>(h.session >> (24 - 8 * i));
    p[12 + i] = static_cast<uint8_t>(h.generation >> (24 - 8 * i));
  }
}

// False when shorter than a header or a reserved bit is set (the switch drops those too).
inline bool DecodeHeader(const uint8_t* p, size_t n, Header* h) {
  if (n < HEADER_LEN) return false;
  if ((p[6] & FLAG_RESERVED) != 0 || p[7] != 0) return false;
  h->group_id = static_cast<uint16_t>(p[0] << 8 | p[1]);
  h->agg_index = static_cast<uint16_t>(p[2] << 8 | p[3]);
  h->worker_id = p[4];
  h->num_workers = p[5];
  h->version = (p[6] & FLAG_VERSION) ? 1 : 0;
  h->is_retx = (p[6] & FLAG_RETX) != 0;
  h->is_result = (p[6] & FLAG_RESULT) != 0;
  h->session = 0;
  h->generation = 0;
  for (int i = 0; i < 4; i++) {
    h->session = h->session << 8 | p[8 + i];
    h->generation = h->generation << 8 | p[12 + i];
  }
  return true;
}

}  // namespace heroserve::ina
