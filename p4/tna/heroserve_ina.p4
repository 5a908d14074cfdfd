/*
 * HeroServe in-network aggregation (INA) data plane, TNA (Tofino Native Architecture).
 *
 * Not compiled for a Tofino here: bf-p4c and the SDE are proprietary. The program is
 * front-end checked with the open-source p4test against the open-source Tofino includes
 * (docs/dataplane.md, "Checking the P4 programs"; tests/agents/softswitch/test_p4info.py). It
 * keeps the behaviour of the v1model program p4/heroserve_ina.p4 (same headers, table names
 * and keys, drop reasons, counters and slot protocol; docs/dataplane.md), written with TNA
 * idioms, as the starting point of a Tofino build. Expect to adjust it to the SDE at hand.
 *
 * Differences forced by the hardware (each register may be touched once per packet, by
 * one RegisterAction, in one stage; each counter is updated at most once per packet):
 *  - the pool is 32 register arrays (pool_0 .. pool_31), one per vector element, indexed
 *    by the copy (slot << 1) | version, instead of v1model's single indexed array;
 *  - slot_tag holds the owner (group_id ++ agg_index) and the session as a pair of 32-bit
 *    halves, checked and taken over by one RegisterAction that says whether the copy is
 *    the packet's session, newly the packet's (a new owner or a newer session), or of a
 *    newer session (the packet is late);
 *  - the copy's generation check is one RegisterAction on slot_gen that returns what the
 *    packet is to the copy (same round, new round, late), and the bitmap, count and pool
 *    RegisterActions that follow pick their variant (set / reset, add / overwrite / read)
 *    from that answer;
 *  - ingress -> egress state travels in a bridged header;
 *  - one lane format per build (docs/dataplane.md, "Lane formats": 32 lane SALUs plus the
 *    bookkeeping fill 37 of a Tofino 1 pipe's 48, no room for a second pool): int32 by
 *    default, bfp16 with -DINA_BFP16, where each pool register is a pair of int16 halves
 *    that one SALU adds with saturation (|+|), and exp_max keeps the maximum of the
 *    members' exponent proposals (SwitchML's exponents.p4 idiom). A packet of the other
 *    format is dropped (DROP_LANE_FORMAT). No overflow flag here: the SALU does not report
 *    that it saturated, so bfp16 hosts see a saturated lane as ±32767 beyond the honest
 *    headroom instead (the v1model program sets the flag).
 */
#include <core.p4>
#include <tna.p4>

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_BRIDGE = 0x88B6;  // never on the wire: marks bridged metadata
const bit<8>  IPPROTO_UDP    = 17;
const bit<16> INA_UDP_PORT   = 48879;

#define NUM_SLOTS 1024
#define NUM_PORTS 512
#define INA_MAX_WORKERS 32
const bit<32> SESSION_HALF = 0x80000000;  // sessions compare as RFC 1982 serial numbers

const bit<4> DROP_SHORT_HEADER      = 0;
const bit<4> DROP_BAD_WORKER_ID     = 1;
const bit<4> DROP_WORKER_MISMATCH   = 2;
const bit<4> DROP_NO_ENTRY          = 3;
const bit<4> DROP_SLOT_OUT_OF_RANGE = 4;
const bit<4> DROP_RESERVED_BITS     = 5;
const bit<4> DROP_WRONG_PORT        = 6;
const bit<4> DROP_BAD_INDEX         = 7;
const bit<4> DROP_FRAGMENT          = 8;
const bit<4> DROP_LATE              = 9;
const bit<4> DROP_LANE_FORMAT       = 10;

#ifdef INA_BFP16
const bit<1> LANE_BFP16 = 1;
#else
const bit<1> LANE_BFP16 = 0;
#endif

const bit<3> EVT_ADDED          = 0;
const bit<3> EVT_COMPLETED      = 1;
const bit<3> EVT_RETX_ANSWERED  = 2;
const bit<3> EVT_RETX_ABSORBED  = 3;
const bit<3> EVT_TRANSIT        = 4;

// Whose copy it is (slot_tag_check's answer).
const bit<8> OWNER_SAME = 0;  // this owner and session
const bit<8> OWNER_NEW  = 1;  // a new owner or a newer session: taken over
const bit<8> OWNER_LATE = 2;  // an older session: dropped

// What a contribution is to its copy (slot_gen_check's answer).
const bit<8> ROUND_SAME = 0;  // the copy's own round
const bit<8> ROUND_NEW  = 1;  // a newer round (or a new owner): the copy starts over
const bit<8> ROUND_LATE = 2;  // an older round: dropped

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;

header bridge_h {
    bit<16>  ether_type;    // ETHERTYPE_BRIDGE
    bit<1>   ina_result;
    bit<1>   l2_flood;
    bit<5>   pad;
    PortId_t ingress_port;  // 9 bits: flooded frames never go back there
}

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

header ina_h {
    bit<16> group_id;
    bit<16> agg_index;
    bit<8>  worker_id;
    bit<8>  num_workers;
    bit<1>  version;
    bit<1>  is_retx;
    bit<1>  is_result;
    bit<1>  bfp16;        // lane format: 0 int32, 1 bfp16 (int16 lanes)
    bit<1>  overflow;     // bfp16 results (v1model); reserved elsewhere
    bit<3>  reserved;     // must be 0
    bit<8>  exp;          // bfp16: biased exponent proposal / agreed maximum; int32: 0
    bit<32> session;      // the group's session (one per job start)
    bit<32> generation;   // use of this copy: round r = ((generation - first) << 1) | version
}

struct lane_pair_t {      // bfp16: lanes 2i (hi) and 2i+1 (lo) of one pool word
    int<16> hi;
    int<16> lo;
}

struct tag_pair_t {
    bit<32> owner;        // group_id ++ agg_index
    bit<32> session;
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
    bridge_h   bridge;
    ethernet_h ethernet;
    ipv4_h     ipv4;
    udp_h      udp;
    ina_h      ina;
    ina_data_h ina_data;
}

struct ig_metadata_t {
    bit<16> slot;
    bit<8>  expected;
    bit<16> ina_mcast_grp;
    PortId_t worker_port;
    bit<1>  ina_miss;
    bit<1>  do_l2;
    bit<1>  reclaimed;     // slot_tag changed: a new owner or a newer session
    bit<8>  owner;         // OWNER_SAME / OWNER_NEW / OWNER_LATE
    bit<32> tag;
    bit<32> copy;          // (slot << 1) | version
    bit<32> wbit;
    bit<8>  round;         // ROUND_SAME / ROUND_NEW / ROUND_LATE
    bit<32> old_bitmap;
    bit<8>  old_count;
    bit<8>  new_count;
}

#ifdef INA_BFP16
// The round's largest exponent proposal (the first contribution writes, later ones take the
// maximum, a retransmission on a complete round reads).
#define EXP_MAX_REGISTER \
    Register<bit<8>, bit<32>>(NUM_SLOTS * 2, 0) exp_max; \
    RegisterAction<bit<8>, bit<32>, bit<8>>(exp_max) exp_write = { \
        void apply(inout bit<8> value, out bit<8> rv) { value = hdr.ina.exp; rv = value; } }; \
    RegisterAction<bit<8>, bit<32>, bit<8>>(exp_max) exp_take_max = { \
        void apply(inout bit<8> value, out bit<8> rv) { \
            value = max(value, hdr.ina.exp); rv = value; } }; \
    RegisterAction<bit<8>, bit<32>, bit<8>>(exp_max) exp_read = { \
        void apply(inout bit<8> value, out bit<8> rv) { rv = value; } };
#define EXP_WRITE hdr.ina.exp = exp_write.execute(meta.copy);
#define EXP_MAX   hdr.ina.exp = exp_take_max.execute(meta.copy);
#define EXP_READ  hdr.ina.exp = exp_read.execute(meta.copy);
#else
#define EXP_MAX_REGISTER
#define EXP_WRITE
#define EXP_MAX
#define EXP_READ
#endif

struct eg_metadata_t {
    bit<1>   ina_result;
    bit<1>   l2_flood;
    PortId_t ingress_port;
}

// ---- ingress parser -----------------------------------------------------------------

parser InaIngressParser(packet_in pkt, out headers_t hdr, out ig_metadata_t meta,
                        out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        // Every field of the out parameter is written before use (p4test checks it).
        meta.slot = 0;
        meta.expected = 0;
        meta.ina_mcast_grp = 0;
        meta.worker_port = 0;
        meta.ina_miss = 0;
        meta.do_l2 = 0;
        meta.reclaimed = 0;
        meta.owner = 0;
        meta.tag = 0;
        meta.copy = 0;
        meta.wbit = 0;
        meta.round = 0;
        meta.old_bitmap = 0;
        meta.old_count = 0;
        meta.new_count = 0;
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        transition parse_ethernet;
    }
    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        // Fragment offset 0 only; a first fragment (More-Fragments) is dropped in ingress.
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
        // Tofino drops packets on parser errors unless the error is handled; a short INA
        // packet is instead detected in ingress by the missing ina_data header
        // (configure the parser error handling to pass PARSER_ERROR_PARTIAL_HDR on).
        pkt.extract(hdr.ina);
        pkt.extract(hdr.ina_data);
        transition accept;
    }
}

// ---- ingress ------------------------------------------------------------------------

// Per element i: 3 RegisterActions on pool_i (overwrite, accumulate, read), indexed by
// the copy.
#ifdef INA_BFP16
#define POOL(i) \
    Register<lane_pair_t, bit<32>>(NUM_SLOTS * 2, {0, 0}) pool_##i; \
    RegisterAction<lane_pair_t, bit<32>, bit<32>>(pool_##i) pool_##i##_write = { \
        void apply(inout lane_pair_t value, out bit<32> rv) { \
            value.hi = (int<16>) hdr.ina_data.v##i[31:16]; \
            value.lo = (int<16>) hdr.ina_data.v##i[15:0]; \
            rv = hdr.ina_data.v##i; } }; \
    RegisterAction<lane_pair_t, bit<32>, bit<32>>(pool_##i) pool_##i##_add = { \
        void apply(inout lane_pair_t value, out bit<32> rv) { \
            value.hi = value.hi |+| (int<16>) hdr.ina_data.v##i[31:16]; \
            value.lo = value.lo |+| (int<16>) hdr.ina_data.v##i[15:0]; \
            rv = (bit<16>) value.hi ++ (bit<16>) value.lo; } }; \
    RegisterAction<lane_pair_t, bit<32>, bit<32>>(pool_##i) pool_##i##_read = { \
        void apply(inout lane_pair_t value, out bit<32> rv) { \
            rv = (bit<16>) value.hi ++ (bit<16>) value.lo; } };
#else
#define POOL(i) \
    Register<bit<32>, bit<32>>(NUM_SLOTS * 2, 0) pool_##i; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(pool_##i) pool_##i##_write = { \
        void apply(inout bit<32> value, out bit<32> rv) { \
            value = hdr.ina_data.v##i; rv = value; } }; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(pool_##i) pool_##i##_add = { \
        void apply(inout bit<32> value, out bit<32> rv) { \
            value = value + hdr.ina_data.v##i; rv = value; } }; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(pool_##i) pool_##i##_read = { \
        void apply(inout bit<32> value, out bit<32> rv) { rv = value; } };
#endif

#define POOL_WRITE(i) hdr.ina_data.v##i = pool_##i##_write.execute(meta.copy);
#define POOL_ADD(i)   hdr.ina_data.v##i = pool_##i##_add.execute(meta.copy);
#define POOL_READ(i)  hdr.ina_data.v##i = pool_##i##_read.execute(meta.copy);

control InaIngress(inout headers_t hdr, inout ig_metadata_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    Counter<bit<32>, bit<4>>(16, CounterType_t.PACKETS) ina_drops;
    Counter<bit<32>, bit<3>>(8, CounterType_t.PACKETS) ina_events;
    Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) slot_reclaims;
    Counter<bit<64>, PortId_t>(NUM_PORTS, CounterType_t.PACKETS_AND_BYTES) port_rx;

    POOL(0)  POOL(1)  POOL(2)  POOL(3)  POOL(4)  POOL(5)  POOL(6)  POOL(7)
    POOL(8)  POOL(9)  POOL(10) POOL(11) POOL(12) POOL(13) POOL(14) POOL(15)
    POOL(16) POOL(17) POOL(18) POOL(19) POOL(20) POOL(21) POOL(22) POOL(23)
    POOL(24) POOL(25) POOL(26) POOL(27) POOL(28) POOL(29) POOL(30) POOL(31)
    EXP_MAX_REGISTER

    // slot_tag, per copy: owner (group_id ++ agg_index) and session. Another owner or a
    // newer session takes the copy over; an older session is late.
    Register<tag_pair_t, bit<32>>(NUM_SLOTS * 2, {0, 0}) slot_tag;
    RegisterAction<tag_pair_t, bit<32>, bit<8>>(slot_tag) slot_tag_check = {
        void apply(inout tag_pair_t value, out bit<8> rv) {
            bit<32> newer = hdr.ina.session - value.session;
            if (value.owner != meta.tag || (newer != 0 && newer < SESSION_HALF)) {
                value.owner = meta.tag;
                value.session = hdr.ina.session;
                rv = OWNER_NEW;
            } else if (newer == 0) {
                rv = OWNER_SAME;
            } else {
                rv = OWNER_LATE;
            }
        }
    };

    // slot_gen, per copy: the generation of the copy's round. Classifies the packet and
    // moves the copy to a newer round (docs/dataplane.md, "Slot protocol").
    // Only the next generation opens a new round (a worker's round r finds its copy at
    // r - 2 or r); every other one but the copy's own is late.
    Register<bit<32>, bit<32>>(NUM_SLOTS * 2, 0) slot_gen;
    RegisterAction<bit<32>, bit<32>, bit<8>>(slot_gen) slot_gen_check = {
        void apply(inout bit<32> value, out bit<8> rv) {
            bit<32> ahead = hdr.ina.generation - value;
            if (meta.reclaimed == 1 || ahead == 1) {
                value = hdr.ina.generation;
                rv = ROUND_NEW;
            } else if (ahead == 0) {
                rv = ROUND_SAME;
            } else {
                rv = ROUND_LATE;
            }
        }
    };

    // seen, per copy: set this worker's bit and return the old bitmap; on a new round,
    // forget the other workers.
    Register<bit<32>, bit<32>>(NUM_SLOTS * 2, 0) seen;
    RegisterAction<bit<32>, bit<32>, bit<32>>(seen) seen_set = {
        void apply(inout bit<32> value, out bit<32> rv) { rv = value; value = value | meta.wbit; }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(seen) seen_reset = {
        void apply(inout bit<32> value, out bit<32> rv) { rv = 0; value = meta.wbit; }
    };

    // contrib_count: count modulo the worker count (0 = complete or unused); returns the
    // old value. The retransmission path only reads it.
    Register<bit<8>, bit<32>>(NUM_SLOTS * 2, 0) contrib_count;
    RegisterAction<bit<8>, bit<32>, bit<8>>(contrib_count) count_incr = {
        void apply(inout bit<8> value, out bit<8> rv) {
            rv = value;
            if (value == meta.expected - 1) { value = 0; } else { value = value + 1; }
        }
    };
    RegisterAction<bit<8>, bit<32>, bit<8>>(contrib_count) count_reset = {
        void apply(inout bit<8> value, out bit<8> rv) {
            rv = 0;
            if (meta.expected == 1) { value = 0; } else { value = 1; }
        }
    };
    RegisterAction<bit<8>, bit<32>, bit<8>>(contrib_count) count_read = {
        void apply(inout bit<8> value, out bit<8> rv) { rv = value; }
    };

    action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    action set_slot(bit<16> slot, bit<8> num_workers, bit<16> mcast_grp) {
        meta.slot = slot;
        meta.expected = num_workers;
        meta.ina_mcast_grp = mcast_grp;
    }

    action set_worker_port(PortId_t port) {
        meta.worker_port = port;
    }

    action forward(PortId_t port) {
        ig_tm_md.ucast_egress_port = port;
    }

    action l2_multicast(bit<16> mcast_grp) {
        ig_tm_md.mcast_grp_a = mcast_grp;
        hdr.bridge.l2_flood = 1;
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
        hdr.bridge.ina_result = 1;
    }

    apply {
        port_rx.count(ig_intr_md.ingress_port);
        hdr.bridge.setValid();
        hdr.bridge.ether_type = ETHERTYPE_BRIDGE;
        hdr.bridge.ina_result = 0;
        hdr.bridge.l2_flood = 0;
        hdr.bridge.pad = 0;
        hdr.bridge.ingress_port = ig_intr_md.ingress_port;
        meta.do_l2 = 1;
        meta.ina_miss = 0;

        if (hdr.udp.isValid() && hdr.udp.dst_port == INA_UDP_PORT) {
            meta.do_l2 = 0;
            if ((hdr.ipv4.flags & 1) == 1) {
                ina_drops.count(DROP_FRAGMENT);
                drop();
            } else if (!hdr.ina_data.isValid()) {
                ina_drops.count(DROP_SHORT_HEADER);
                drop();
            } else if (hdr.ina.reserved != 0
                    || (hdr.ina.bfp16 == 0 && hdr.ina.exp != 0)
                    || (hdr.ina.overflow == 1
                        && (hdr.ina.bfp16 == 0 || hdr.ina.is_result == 0))) {
                ina_drops.count(DROP_RESERVED_BITS);
                drop();
            } else if (hdr.ina.is_result == 1) {
                meta.do_l2 = 1;
            } else if (hdr.ina.bfp16 != LANE_BFP16) {
                // This build adds the other lane format.
                ina_drops.count(DROP_LANE_FORMAT);
                drop();
            } else if (hdr.ina.worker_id >= hdr.ina.num_workers
                    || hdr.ina.num_workers > INA_MAX_WORKERS) {
                ina_drops.count(DROP_BAD_WORKER_ID);
                drop();
            } else {
                bool agg_hit = aggregation_table.apply().hit;
                bool port_hit = worker_port.apply().hit;
                if (!agg_hit && !port_hit) {
                    meta.do_l2 = 1;
                    meta.ina_miss = 1;
                } else if (!port_hit || meta.worker_port != ig_intr_md.ingress_port) {
                    ina_drops.count(DROP_WRONG_PORT);
                    drop();
                } else if (!agg_hit) {
                    ina_drops.count(DROP_BAD_INDEX);
                    drop();
                } else if (meta.expected != hdr.ina.num_workers) {
                    ina_drops.count(DROP_WORKER_MISMATCH);
                    drop();
                } else if (meta.slot >= NUM_SLOTS) {
                    ina_drops.count(DROP_SLOT_OUT_OF_RANGE);
                    drop();
                } else {
                    meta.tag = hdr.ina.group_id ++ hdr.ina.agg_index;
                    meta.copy = (bit<32>) (meta.slot ++ hdr.ina.version);
                    meta.wbit = (bit<32>) 1 << hdr.ina.worker_id;
                    meta.reclaimed = 0;
                    meta.round = ROUND_LATE;
                    meta.owner = slot_tag_check.execute(meta.copy);
                    if (meta.owner == OWNER_NEW) {
                        meta.reclaimed = 1;
                        slot_reclaims.count(0);
                    }
                    if (meta.owner != OWNER_LATE) {
                        meta.round = slot_gen_check.execute(meta.copy);
                    }

                    if (meta.round == ROUND_LATE) {
                        ina_drops.count(DROP_LATE);
                        drop();
                    } else {
                        if (meta.round == ROUND_NEW) {
                            meta.old_bitmap = seen_reset.execute(meta.copy);
                        } else {
                            meta.old_bitmap = seen_set.execute(meta.copy);
                        }
                        if ((meta.old_bitmap & meta.wbit) == 0) {
                            if (meta.round == ROUND_NEW) {
                                meta.old_count = count_reset.execute(meta.copy);
                            } else {
                                meta.old_count = count_incr.execute(meta.copy);
                            }
                            if (meta.old_count == 0) {
                                POOL_WRITE(0)  POOL_WRITE(1)  POOL_WRITE(2)  POOL_WRITE(3)
                                POOL_WRITE(4)  POOL_WRITE(5)  POOL_WRITE(6)  POOL_WRITE(7)
                                POOL_WRITE(8)  POOL_WRITE(9)  POOL_WRITE(10) POOL_WRITE(11)
                                POOL_WRITE(12) POOL_WRITE(13) POOL_WRITE(14) POOL_WRITE(15)
                                POOL_WRITE(16) POOL_WRITE(17) POOL_WRITE(18) POOL_WRITE(19)
                                POOL_WRITE(20) POOL_WRITE(21) POOL_WRITE(22) POOL_WRITE(23)
                                POOL_WRITE(24) POOL_WRITE(25) POOL_WRITE(26) POOL_WRITE(27)
                                POOL_WRITE(28) POOL_WRITE(29) POOL_WRITE(30) POOL_WRITE(31)
                                EXP_WRITE
                            } else {
                                POOL_ADD(0)  POOL_ADD(1)  POOL_ADD(2)  POOL_ADD(3)
                                POOL_ADD(4)  POOL_ADD(5)  POOL_ADD(6)  POOL_ADD(7)
                                POOL_ADD(8)  POOL_ADD(9)  POOL_ADD(10) POOL_ADD(11)
                                POOL_ADD(12) POOL_ADD(13) POOL_ADD(14) POOL_ADD(15)
                                POOL_ADD(16) POOL_ADD(17) POOL_ADD(18) POOL_ADD(19)
                                POOL_ADD(20) POOL_ADD(21) POOL_ADD(22) POOL_ADD(23)
                                POOL_ADD(24) POOL_ADD(25) POOL_ADD(26) POOL_ADD(27)
                                POOL_ADD(28) POOL_ADD(29) POOL_ADD(30) POOL_ADD(31)
                                EXP_MAX
                            }
                            meta.new_count = meta.old_count + 1;
                            if (meta.new_count == meta.expected) {
                                make_result();
                                ig_tm_md.mcast_grp_a = meta.ina_mcast_grp;
                                ina_events.count(EVT_COMPLETED);
                            } else {
                                ina_events.count(EVT_ADDED);
                                drop();
                            }
                        } else {
                            meta.old_count = count_read.execute(meta.copy);
                            if (meta.old_count == 0) {
                                POOL_READ(0)  POOL_READ(1)  POOL_READ(2)  POOL_READ(3)
                                POOL_READ(4)  POOL_READ(5)  POOL_READ(6)  POOL_READ(7)
                                POOL_READ(8)  POOL_READ(9)  POOL_READ(10) POOL_READ(11)
                                POOL_READ(12) POOL_READ(13) POOL_READ(14) POOL_READ(15)
                                POOL_READ(16) POOL_READ(17) POOL_READ(18) POOL_READ(19)
                                POOL_READ(20) POOL_READ(21) POOL_READ(22) POOL_READ(23)
                                POOL_READ(24) POOL_READ(25) POOL_READ(26) POOL_READ(27)
                                POOL_READ(28) POOL_READ(29) POOL_READ(30) POOL_READ(31)
                                EXP_READ
                                make_result();
                                ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
                                ina_events.count(EVT_RETX_ANSWERED);
                            } else {
                                ina_events.count(EVT_RETX_ABSORBED);
                                drop();
                            }
                        }
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

control InaIngressDeparser(packet_out pkt, inout headers_t hdr, in ig_metadata_t meta,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        // The IPv4 checksum of results is recomputed in egress, after result_rewrite.
        pkt.emit(hdr);
    }
}

// ---- egress -------------------------------------------------------------------------

parser InaEgressParser(packet_in pkt, out headers_t hdr, out eg_metadata_t meta,
                       out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        meta.ina_result = hdr.bridge.ina_result;
        meta.l2_flood = hdr.bridge.l2_flood;
        meta.ingress_port = hdr.bridge.ingress_port;
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition accept;
    }
}

control InaEgress(inout headers_t hdr, inout eg_metadata_t meta,
                  in egress_intrinsic_metadata_t eg_intr_md,
                  in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                  inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                  inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    Counter<bit<64>, PortId_t>(NUM_PORTS, CounterType_t.PACKETS_AND_BYTES) port_tx;

    action set_result_dst(mac_addr_t dmac, ipv4_addr_t dip) {
        hdr.ethernet.dst_addr = dmac;
        hdr.ipv4.dst_addr = dip;
    }

    table result_rewrite {
        key = {
            eg_intr_md.egress_port : exact @name("egress_port");
        }
        actions = {
            set_result_dst;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = 512;
    }

    apply {
        hdr.bridge.setInvalid();
        // (Tofino's PRE could prune the ingress port with level-2 exclusion ids; this
        // check keeps the v1model program's semantics without programming them.)
        if (meta.l2_flood == 1 && eg_intr_md.egress_port == meta.ingress_port) {
            eg_dprsr_md.drop_ctl = 1;
        } else {
            if (meta.ina_result == 1) {
                result_rewrite.apply();
            }
            port_tx.count(eg_intr_md.egress_port);
        }
    }
}

control InaEgressDeparser(packet_out pkt, inout headers_t hdr, in eg_metadata_t meta,
                          in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;
    apply {
        if (meta.ina_result == 1) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset,
                hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr });
        }
        pkt.emit(hdr);
    }
}

Pipeline(InaIngressParser(), InaIngress(), InaIngressDeparser(),
         InaEgressParser(), InaEgress(), InaEgressDeparser()) pipe;

Switch(pipe) main;
