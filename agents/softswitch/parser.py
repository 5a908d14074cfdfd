"""``parser InaParser`` and ``control InaDeparser`` of p4/heroserve_ina.p4: frame bytes to
``headers_t`` and back (:class:`InaParser`, :class:`InaDeparser`), the two ends of the
executable model (agents/softswitch/pipeline.py).
"""

from __future__ import annotations

import struct

from agents.ina.packet import HEADER_LEN, HEADER_STRUCT, INA_UDP_PORT, VECTOR_BYTES, VECTOR_LEN

from .headers import Headers, InaH

_ETH_LEN = 14
_IPV4_LEN = 20
_UDP_LEN = 8
_DATA = struct.Struct(f"!{VECTOR_LEN}I")  # the lanes as P4 reads them: unsigned bit<32>


class InaParser:
    """``parser InaParser``: Ethernet -> IPv4 (ihl 5, fragment offset 0, UDP) -> UDP -> INA."""

    @staticmethod
    def parse(frame: bytes) -> Headers | None:
        """Headers of ``frame``; None when shorter than Ethernet (no NIC delivers that)."""
        h = Headers()
        n = len(frame)
        if n < _ETH_LEN:
            return None
        h.eth = bytearray(frame[:_ETH_LEN])
        off = _ETH_LEN
        if frame[12] == 0x08 and frame[13] == 0x00 and n >= off + _IPV4_LEN:
            h.ipv4 = bytearray(frame[off : off + _IPV4_LEN])
            off += _IPV4_LEN
            ip = h.ipv4
            ihl = ip[0] & 0x0F
            frag_offset = ((ip[6] & 0x1F) << 8) | ip[7]
            if ihl == 5 and frag_offset == 0 and ip[9] == 17 and n >= off + _UDP_LEN:
                h.udp = bytearray(frame[off : off + _UDP_LEN])
                off += _UDP_LEN
                if (h.udp[2] << 8 | h.udp[3]) == INA_UDP_PORT and n >= off + HEADER_LEN:
                    g, a, w, nw, flags, res2, sess, gen = HEADER_STRUCT.unpack_from(frame, off)
                    version, retx, result = flags >> 7, (flags >> 6) & 1, (flags >> 5) & 1
                    bfp16, ovf = (flags >> 4) & 1, (flags >> 3) & 1
                    h.ina = InaH(
                        g, a, w, nw, version, retx, result, bfp16, ovf, flags & 7, res2, sess, gen
                    )
                    off += HEADER_LEN
                    if n >= off + VECTOR_BYTES:
                        h.ina_data = list(_DATA.unpack_from(frame, off))
                        off += VECTOR_BYTES
        h.payload = frame[off:]
        return h


class InaDeparser:
    """``control InaDeparser``: emit the valid headers, then the unparsed payload."""

    @staticmethod
    def emit(hdr: Headers) -> bytes:
        parts: list[bytes] = []
        if hdr.eth is not None:
            parts.append(bytes(hdr.eth))
        if hdr.ipv4 is not None:
            parts.append(bytes(hdr.ipv4))
        if hdr.udp is not None:
            parts.append(bytes(hdr.udp))
        if hdr.ina is not None:
            i = hdr.ina
            flags = (
                (i.version << 7)
                | (i.is_retx << 6)
                | (i.is_result << 5)
                | (i.bfp16 << 4)
                | (i.overflow << 3)
                | i.reserved
            )
            parts.append(
                HEADER_STRUCT.pack(
                    i.group_id,
                    i.agg_index,
                    i.worker_id,
                    i.num_workers,
                    flags,
                    i.exp,
                    i.session,
                    i.generation,
                )
            )
        if hdr.ina_data is not None:
            parts.append(_DATA.pack(*hdr.ina_data))
        parts.append(hdr.payload)
        return b"".join(parts)
