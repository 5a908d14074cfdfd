/*
 * HeroServe in-network aggregation (INA) data plane, v1model (BMv2 simple_switch_grpc).
 *
 * Specification: docs/design.md §10; HeroServe paper §IV "Agent on Programmable Switches";
 * slot protocol after SwitchML (NSDI'21), with a generation per shadow copy so that it is
 * exactly-once under loss, duplication, reordering and delay. Layout and protocol:
 * docs/dataplane.md.
 *
 * Build:  p4c-bm2-ss --p4v 16 --p4runtime-files p4/heroserve_ina.p4info.txtpb \
 *             -o build/p4/heroserve_ina.json p4/heroserve_ina.p4
 *
 * The executable model agents/softswitch/ implements this program exactly (same names,
 * registers, drop reasons); keep the two in step
 * (tests/agents/softswitch/test_softswitch_bmv2_diff.py compares them packet by packet where
 * BMv2 is installed).
 *
 * Packet: Ethernet / IPv4 (no options, not a fragment) / UDP dst port 48879 /
 *         ina_h (16 bytes) / ina_data_h (128 bytes of lanes, big-endian): 32 x int32, or
 *         with the bfp16 bit 64 x int16 (lane 2i in the high half of v_i, 2i+1 in the low
 *         half), docs/dataplane.md "Lane formats".
 *
 * Registers, per slot and version ("copy" c = (slot << 1) | version):
 *   pool[(c << 5) | i]    partial sum of element i
 *   contrib_count[c]      contributions so far, modulo the worker count
 *                         (0 = round complete, or copy never used)
 *   seen[c]               bitmap of the workers that contributed to the copy's round
 *   slot_gen[c]           generation of the round the copy holds
 *   slot_tag[c]           (group_id ++ agg_index ++ session) that owns the copy
 *   lane_state[c]         the round's lane format (bit 0: bfp16) and bfp16 overflow (bit 1)
 *   exp_max[c]            bfp16: the largest exponent proposal of the round's contributions
 */
#include <core.p4>
#include <v1model.p4>

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IPPROTO_UDP    = 17;
const bit<16> INA_UDP_PORT   = 48879;   // 0xBEEF marks INA traffic

#define INA_VECTOR_LEN 32               // int32 elements per packet
#define INA_MAX_WORKERS 32              // width of the seen bitmap
const bit<32> NUM_SLOTS      = 1024;    // aggregator slots (each with two versions)
const bit<32> NUM_PORTS      = 512;     // v1model ports are bit<9>
const bit<32> SESSION_HALF   = 0x80000000;  // sessions compare as RFC 1982 serial numbers

// ina_drops indices (drop reasons); docs/dataplane.md lists them.
const bit<32> DROP_SHORT_HEADER      = 0;  // UDP port says INA but header/vector truncated
const bit<32> DROP_BAD_WORKER_ID     = 1;  // worker_id >= num_workers or num_workers > 32
const bit<32> DROP_WORKER_MISMATCH   = 2;  // num_workers differs from the table entry
const bit<32> DROP_NO_ENTRY          = 3;  // not aggregated here and no L2 route
const bit<32> DROP_SLOT_OUT_OF_RANGE = 4;  // table entry points past the register arrays
const bit<32> DROP_RESERVED_BITS     = 5;  // reserved flag bits not zero
const bit<32> DROP_WRONG_PORT        = 6;  // worker id not bound to this ingress port
const bit<32> DROP_BAD_INDEX         = 7;  // group aggregated here, agg_index outside it
const bit<32> DROP_FRAGMENT          = 8;  // first IPv4 fragment (More-Fragments set)
const bit<32> DROP_LATE              = 9;  // older session, or not the copy's generation or the next
const bit<32> DROP_LANE_FORMAT       = 10; // not the lane format of the round's first contribution
#define INA_DROP_REASONS 16

// ina_events indices: what happened to a packet that passed the checks (one per packet).
const bit<32> EVT_ADDED          = 0;  // contribution added, round still open
const bit<32> EVT_COMPLETED      = 1;  // last contribution: result multicast
const bit<32> EVT_RETX_ANSWERED  = 2;  // duplicate on a complete round: result unicast back
const bit<32> EVT_RETX_ABSORBED  = 3;  // duplicate on an open round: dropped, not added
const bit<32> EVT_TRANSIT        = 4;  // not aggregated here, forwarded by L2
#define INA_EVENTS 8

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;

header ethernet_h {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

header ipv4_h {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      diffserv;
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header udp_h {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

// 16 bytes, network byte order.
header ina_h {
    bit<16> group_id;     // job/group id assigned by the controller
    bit<16> agg_index;    // aggregator index within the group (the window position)
    bit<8>  worker_id;    // 0 .. num_workers-1
    bit<8>  num_workers;  // must equal the table entry's worker count
    bit<1>  version;      // which of the slot's two shadow copies
    bit<1>  is_retx;      // sender says this is a retransmission (informational)
    bit<1>  is_result;    // set by the switch on aggregated results
    bit<1>  bfp16;        // lane format: 0 int32, 1 bfp16 (int16 lanes)
    bit<1>  overflow;     // bfp16 results: a lane saturated (reserved elsewhere)
    bit<3>  reserved;     // must be 0
    bit<8>  exp;          // bfp16: biased exponent proposal / agreed maximum; int32: 0
    bit<32> session;      // the group's session (one per job start)
    bit<32> generation;   // use of this copy: round r = ((generation - first) << 1) | version
}

header ina_data_h {
    bit<32> v0;  bit<32> v1;  bit<32> v2;  bit<32> v3;
    bit<32> v4;  bit<32> v5;  bit<32> v6;  bit<32> v7;
    bit<32> v8;  bit<32> v9;  bit<32> v10; bit<32> v11;
    bit<32> v12; bit<32> v13; bit<32> v14; bit<32> v15;
    bit<32> v16; bit<32> v17; bit<32> v18; bit<32> v19;
    bit<32> v20; bit<32> v21; bit<32> v22; bit<32> v23;
    bit<32> v24; bit<32> v25; bit<32> v26; bit<32> v27;
    bit<32> v28; bit<32> v29; bit<32> v30; bit<32> v31;
}

struct headers_t {
    ethernet_h ethernet;
    ipv4_h     ipv4;
    udp_h      udp;
    ina_h      ina;
    ina_data_h ina_data;
}

struct metadata_t {
    bit<16> slot;          // from aggregation_table
    bit<8>  expected;      // worker count from aggregation_table
    bit<16> ina_mcast_grp; // result multicast group from aggregation_table
    bit<9>  worker_port;   // from worker_port: the port this worker id may arrive on
    bit<1>  ina_miss;      // INA contribution this switch does not aggregate
    bit<1>  do_l2;         // forward by l2_forward
    bit<1>  ina_result;    // this switch produced an aggregation result
    bit<1>  l2_flood;      // replicated by l2_multicast: never hairpin
    bit<64> tag;           // group_id ++ agg_index ++ session
    bit<32> copy;          // (slot << 1) | version
    bit<32> pool_base;     // copy << 5
    bit<32> keep;          // 0 on the first contribution of a round, else all ones
    bit<32> tmp;
    int<32> s_hi;          // bfp16: the high lane's sum, before saturation
    int<32> s_lo;          // bfp16: the low lane's sum, before saturation
    bit<1>  sat;           // bfp16: a lane of this contribution saturated
    bit<8>  state;         // lane_state of the copy
    bit<8>  emax;          // exp_max of the copy
}

parser InaParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        // Only option-less headers at fragment offset 0 can carry a UDP header; later
        // fragments are plain L2 traffic. A first fragment (More-Fragments set) is parsed
        // so that ingress can drop and count it when it is INA.
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            INA_UDP_PORT: parse_ina;
            default: accept;
        }
    }
    state parse_ina {
        // A truncated packet fails here (PacketTooShort); BMv2 still runs ingress with
        // the headers extracted so far, where the missing ina_data means DROP_SHORT_HEADER.
        pkt.extract(hdr.ina);
        pkt.extract(hdr.ina_data);
        transition accept;
    }
}

control InaVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

// Per-element register update: pool = (pool & keep) + v, result written back to the packet.
#define AGG(i) \
    pool.read(meta.tmp, meta.pool_base + i); \
    meta.tmp = (meta.tmp & meta.keep) + hdr.ina_data.v##i; \
    pool.write(meta.pool_base + i, meta.tmp); \
    hdr.ina_data.v##i = meta.tmp;

#define LOAD(i) pool.read(hdr.ina_data.v##i, meta.pool_base + i);

// bfp16: the word's two int16 lanes added with saturation (docs/dataplane.md, "Overflow").
#define SAT16(s) \
    if (s > 32767) { s = 32767; meta.sat = 1; } \
    if (s < -32768) { s = -32768; meta.sat = 1; }
#define AGG16(i) \
    pool.read(meta.tmp, meta.pool_base + i); \
    meta.s_hi = (int<32>)((int<16>)meta.tmp[31:16]) \
              + (int<32>)((int<16>)hdr.ina_data.v##i[31:16]); \
    meta.s_lo = (int<32>)((int<16>)meta.tmp[15:0]) \
              + (int<32>)((int<16>)hdr.ina_data.v##i[15:0]); \
    SAT16(meta.s_hi) \
    SAT16(meta.s_lo) \
    meta.tmp = ((bit<16>)(bit<32>)meta.s_hi) ++ ((bit<16>)(bit<32>)meta.s_lo); \
    pool.write(meta.pool_base + i, meta.tmp); \
    hdr.ina_data.v##i = meta.tmp;

control InaIngress(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {
    register<bit<32>>(NUM_SLOTS * 64) pool;
    register<bit<8>>(NUM_SLOTS * 2) contrib_count;
    register<bit<32>>(NUM_SLOTS * 2) seen;
    register<bit<32>>(NUM_SLOTS * 2) slot_gen;
    register<bit<64>>(NUM_SLOTS * 2) slot_tag;
    register<bit<8>>(NUM_SLOTS * 2) lane_state;
    register<bit<8>>(NUM_SLOTS * 2) exp_max;

    counter(INA_DROP_REASONS, CounterType.packets) ina_drops;
    counter(INA_EVENTS, CounterType.packets) ina_events;
    counter(1, CounterType.packets) slot_reclaims;
    counter(1, CounterType.packets) lane_overflows;
    counter(NUM_PORTS, CounterType.packets_and_bytes) port_rx;

    action drop() {
        mark_to_drop(standard_metadata);
    }

    action set_slot(bit<16> slot, bit<8> num_workers, bit<16> mcast_grp) {
        meta.slot = slot;
        meta.expected = num_workers;
        meta.ina_mcast_grp = mcast_grp;
    }

    action set_worker_port(bit<9> port) {
        meta.worker_port = port;
    }

    action forward(bit<9> port) {
        standard_metadata.egress_spec = port;
    }

    action l2_multicast(bit<16> mcast_grp) {
        standard_metadata.mcast_grp = mcast_grp;
        meta.l2_flood = 1;
    }

    // Results come from the address and port the workers sent to (a worker accepts results
    // from that address and port only); result_rewrite then gives each replica its worker's
    // destination.
    action make_result() {
        mac_addr_t mac = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        ipv4_addr_t ip = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = ip;
        hdr.ina.is_result = 1;
        hdr.ina.is_retx = 0;
        hdr.udp.src_port = INA_UDP_PORT;
        hdr.udp.checksum = 0;
        meta.ina_result = 1;
    }

    // A result carries the round's format, and for bfp16 the agreed exponent (the maximum
    // of the proposals) and the overflow flag.
    action lane_result() {
        hdr.ina.bfp16 = meta.state[0:0];
        hdr.ina.overflow = meta.state[1:1];
        // An int32 round's exp_max is its first contribution's exp byte: 0, or dropped.
        exp_max.read(meta.emax, meta.copy);
        hdr.ina.exp = meta.emax;
    }

    table aggregation_table {
        key = {
            hdr.ina.group_id  : exact @name("group_id");
            hdr.ina.agg_index : exact @name("agg_index");
        }
        actions = {
            set_slot;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = 4096;
    }

    // Binds each worker id of a group aggregated here to the one port it may arrive on.
    table worker_port {
        key = {
            hdr.ina.group_id  : exact @name("group_id");
            hdr.ina.worker_id : exact @name("worker_id");
        }
        actions = {
            set_worker_port;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = 4096;
    }

    table l2_forward {
        key = {
            hdr.ethernet.dst_addr : exact @name("dst_addr");
        }
        actions = {
            forward;
            l2_multicast;
            drop;
        }
        default_action = drop();
        size = 1024;
    }

    apply {
        port_rx.count((bit<32>) standard_metadata.ingress_port);
        meta.do_l2 = 1;
        meta.ina_miss = 0;
        meta.ina_result = 0;
        meta.l2_flood = 0;

        if (hdr.udp.isValid() && hdr.udp.dst_port == INA_UDP_PORT) {
            meta.do_l2 = 0;
            if ((hdr.ipv4.flags & 1) == 1) {
                ina_drops.count(DROP_FRAGMENT);
                mark_to_drop(standard_metadata);
            } else if (!hdr.ina_data.isValid()) {
                ina_drops.count(DROP_SHORT_HEADER);
                mark_to_drop(standard_metadata);
            } else if (hdr.ina.reserved != 0
                    || (hdr.ina.bfp16 == 0 && hdr.ina.exp != 0)
                    || (hdr.ina.overflow == 1
                        && (hdr.ina.bfp16 == 0 || hdr.ina.is_result == 0))) {
                ina_drops.count(DROP_RESERVED_BITS);
                mark_to_drop(standard_metadata);
            } else if (hdr.ina.is_result == 1) {
                // A result from another switch: plain L2 traffic.
                meta.do_l2 = 1;
            } else if (hdr.ina.worker_id >= hdr.ina.num_workers
                    || hdr.ina.num_workers > INA_MAX_WORKERS) {
                ina_drops.count(DROP_BAD_WORKER_ID);
                mark_to_drop(standard_metadata);
            } else {
                bool agg_hit = aggregation_table.apply().hit;
                bool port_hit = worker_port.apply().hit;
                if (!agg_hit && !port_hit) {
                    // Not aggregated here: transit if L2 knows the destination, else dropped.
                    meta.do_l2 = 1;
                    meta.ina_miss = 1;
                } else if (!port_hit || meta.worker_port != standard_metadata.ingress_port) {
                    ina_drops.count(DROP_WRONG_PORT);
                    mark_to_drop(standard_metadata);
                } else if (!agg_hit) {
                    ina_drops.count(DROP_BAD_INDEX);
                    mark_to_drop(standard_metadata);
                } else if (meta.expected != hdr.ina.num_workers) {
                    ina_drops.count(DROP_WORKER_MISMATCH);
                    mark_to_drop(standard_metadata);
                } else if ((bit<32>) meta.slot >= NUM_SLOTS) {
                    ina_drops.count(DROP_SLOT_OUT_OF_RANGE);
                    mark_to_drop(standard_metadata);
                } else {
                    meta.tag = hdr.ina.group_id ++ hdr.ina.agg_index ++ hdr.ina.session;
                    meta.copy = (((bit<32>) meta.slot) << 1) | (bit<32>) hdr.ina.version;
                    meta.pool_base = meta.copy << 5;

                    // Whose copy, which session: another owner (the slot was given to
                    // another group or index) or a newer session of this one takes the
                    // copy over and starts it with this packet; an older session is late.
                    bit<64> held;
                    slot_tag.read(held, meta.copy);
                    bit<32> newer = hdr.ina.session - held[31:0];
                    bool reclaimed = held[63:32] != meta.tag[63:32]
                                     || (newer != 0 && newer < SESSION_HALF);
                    bool late = !reclaimed && newer != 0;
                    if (reclaimed) {
                        slot_tag.write(meta.copy, meta.tag);
                        slot_reclaims.count(0);
                    }
                    // Which round: the copy's generation (its round), the next one (a new
                    // round: a worker's round r finds its copy at r - 2 or r), anything
                    // else late.
                    bit<32> gen;
                    slot_gen.read(gen, meta.copy);
                    bit<32> ahead = hdr.ina.generation - gen;
                    if (!reclaimed && ahead > 1) {
                        late = true;
                    }
                    bit<32> wbit = (bit<32>) 1 << hdr.ina.worker_id;
                    bit<32> bitmap;
                    bit<8> cnt;
                    seen.read(bitmap, meta.copy);
                    contrib_count.read(cnt, meta.copy);

                    if (reclaimed || (!late && ahead == 1)) {
                        // A new round on this copy: forget the copy's last round.
                        slot_gen.write(meta.copy, hdr.ina.generation);
                        bitmap = 0;
                        cnt = 0;
                    }
                    lane_state.read(meta.state, meta.copy);
                    if (late) {
                        // Late: its round's result is gone and its sender has it, or
                        // its session is over.
                        ina_drops.count(DROP_LATE);
                        mark_to_drop(standard_metadata);
                    } else if ((bitmap & wbit) == 0 && cnt != 0
                               && meta.state[0:0] != hdr.ina.bfp16) {
                        // Another lane format than the round's first contribution.
                        ina_drops.count(DROP_LANE_FORMAT);
                        mark_to_drop(standard_metadata);
                    } else if ((bitmap & wbit) == 0) {
                        // New contribution. The round's first overwrites the pool.
                        seen.write(meta.copy, bitmap | wbit);
                        meta.sat = 0;
                        if (cnt == 0) {
                            meta.keep = 0;
                            meta.state = 7w0 ++ hdr.ina.bfp16;
                            exp_max.write(meta.copy, hdr.ina.exp);
                        } else {
                            meta.keep = 0xffffffff;
                        }
                        if (cnt != 0 && hdr.ina.bfp16 == 1) {
                            AGG16(0)  AGG16(1)  AGG16(2)  AGG16(3)  AGG16(4)  AGG16(5)
                            AGG16(6)  AGG16(7)  AGG16(8)  AGG16(9)  AGG16(10) AGG16(11)
                            AGG16(12) AGG16(13) AGG16(14) AGG16(15) AGG16(16) AGG16(17)
                            AGG16(18) AGG16(19) AGG16(20) AGG16(21) AGG16(22) AGG16(23)
                            AGG16(24) AGG16(25) AGG16(26) AGG16(27) AGG16(28) AGG16(29)
                            AGG16(30) AGG16(31)
                            exp_max.read(meta.emax, meta.copy);
                            if (hdr.ina.exp > meta.emax) {
                                exp_max.write(meta.copy, hdr.ina.exp);
                            }
                            if (meta.sat == 1) {
                                meta.state = meta.state | 2;
                                lane_overflows.count(0);
                            }
                        } else {
                            AGG(0)  AGG(1)  AGG(2)  AGG(3)  AGG(4)  AGG(5)  AGG(6)  AGG(7)
                            AGG(8)  AGG(9)  AGG(10) AGG(11) AGG(12) AGG(13) AGG(14) AGG(15)
                            AGG(16) AGG(17) AGG(18) AGG(19) AGG(20) AGG(21) AGG(22) AGG(23)
                            AGG(24) AGG(25) AGG(26) AGG(27) AGG(28) AGG(29) AGG(30) AGG(31)
                        }
                        lane_state.write(meta.copy, meta.state);

                        cnt = cnt + 1;
                        if (cnt == meta.expected) {
                            contrib_count.write(meta.copy, 0);
                            lane_result();
                            make_result();
                            standard_metadata.mcast_grp = meta.ina_mcast_grp;
                            ina_events.count(EVT_COMPLETED);
                        } else {
                            contrib_count.write(meta.copy, cnt);
                            ina_events.count(EVT_ADDED);
                            mark_to_drop(standard_metadata);
                        }
                    } else if (cnt == 0) {
                        // Duplicate on a complete round: the worker lost the result.
                        // Answer it alone, out of the port it came in on, without adding.
                        LOAD(0)  LOAD(1)  LOAD(2)  LOAD(3)  LOAD(4)  LOAD(5)  LOAD(6)  LOAD(7)
                        LOAD(8)  LOAD(9)  LOAD(10) LOAD(11) LOAD(12) LOAD(13) LOAD(14) LOAD(15)
                        LOAD(16) LOAD(17) LOAD(18) LOAD(19) LOAD(20) LOAD(21) LOAD(22) LOAD(23)
                        LOAD(24) LOAD(25) LOAD(26) LOAD(27) LOAD(28) LOAD(29) LOAD(30) LOAD(31)
                        lane_result();
                        make_result();
                        standard_metadata.egress_spec = standard_metadata.ingress_port;
                        ina_events.count(EVT_RETX_ANSWERED);
                    } else {
                        // Duplicate while the round is still open: already counted.
                        ina_events.count(EVT_RETX_ABSORBED);
                        mark_to_drop(standard_metadata);
                    }
                }
            }
        }

        if (meta.do_l2 == 1) {
            if (l2_forward.apply().hit) {
                if (meta.ina_miss == 1) {
                    ina_events.count(EVT_TRANSIT);
                }
            } else if (meta.ina_miss == 1) {
                ina_drops.count(DROP_NO_ENTRY);
            }
        }
    }
}

control InaEgress(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    counter(NUM_PORTS, CounterType.packets_and_bytes) port_tx;

    action set_result_dst(mac_addr_t dmac, ipv4_addr_t dip) {
        hdr.ethernet.dst_addr = dmac;
        hdr.ipv4.dst_addr = dip;
    }

    // Per-port destination of aggregation results, so each replica reaches its worker's
    // UDP socket. Without an entry the replica keeps the headers it had.
    table result_rewrite {
        key = {
            standard_metadata.egress_port : exact @name("egress_port");
        }
        actions = {
            set_result_dst;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = 512;
    }

    apply {
        if (meta.l2_flood == 1 && standard_metadata.egress_port == standard_metadata.ingress_port) {
            // Flooded frames never go back where they came from.
            mark_to_drop(standard_metadata);
        } else {
            if (meta.ina_result == 1) {
                result_rewrite.apply();
            }
            port_tx.count((bit<32>) standard_metadata.egress_port);
        }
    }
}

control InaComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        // Only results this switch rewrote need a new IPv4 checksum; other traffic is
        // forwarded untouched. UDP checksum of results is 0 (not used, legal for IPv4).
        update_checksum(
            hdr.ina.isValid() && hdr.ina.is_result == 1 && meta.ina_result == 1,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum,
            HashAlgorithm.csum16);
    }
}

control InaDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.ina);
        pkt.emit(hdr.ina_data);
    }
}

V1Switch(InaParser(), InaVerifyChecksum(), InaIngress(), InaEgress(), InaComputeChecksum(),
         InaDeparser()) main;
