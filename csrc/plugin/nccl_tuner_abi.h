/* Our own declarations of NCCL's tuner-plugin C ABI (versions 2 to 6), written from the
 * published interface description (NCCL src/include/plugin/tuner/tuner_v*.h): struct layout
 * and function-pointer shapes must match byte for byte, names of our typedefs are ours.
 * Plain C so the C test harness includes it too. */
#ifndef HEROSERVE_NCCL_TUNER_ABI_H_
#define HEROSERVE_NCCL_TUNER_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int hsNcclResult; /* ncclResult_t: 0 success, 3 internal error, 4 invalid argument */
#define HS_NCCL_SUCCESS 0
#define HS_NCCL_INTERNAL_ERROR 3
#define HS_NCCL_INVALID_ARGUMENT 4

typedef int hsNcclFunc; /* ncclFunc_t */
#define HS_NCCL_FUNC_ALLREDUCE 4

/* ncclDebugLogger_t: level 2 = WARN, 3 = INFO; flags: subsystem mask (64 = TUNING). */
typedef void (*hsNcclLogger)(int level, unsigned long flags, const char* file, int line,
                             const char* fmt, ...);
#define HS_NCCL_LOG_WARN 2
#define HS_NCCL_LOG_INFO 3
#define HS_NCCL_TUNING 64

/* Cost-table indices (ncclAlgo / ncclProto), stable since NCCL 2.19. */
#define HS_ALGO_TREE 0
#define HS_ALGO_RING 1
#define HS_ALGO_COLLNET_DIRECT 2
#define HS_ALGO_COLLNET_CHAIN 3
#define HS_ALGO_NVLS 4
#define HS_ALGO_NVLS_TREE 5
#define HS_ALGO_PAT 6
#define HS_NUM_ALGORITHMS 7
#define HS_PROTO_LL 0
#define HS_PROTO_LL128 1
#define HS_PROTO_SIMPLE 2
#define HS_NUM_PROTOCOLS 3
#define HS_ALGO_PROTO_IGNORE (-1.0f)

typedef struct {
  const char* name;
  hsNcclResult (*init)(size_t nRanks, size_t nNodes, hsNcclLogger logFunction, void** context);
  hsNcclResult (*getCollInfo)(void* context, hsNcclFunc collType, size_t nBytes,
                              int collNetSupport, int nvlsSupport, int numPipeOps,
                              int* algorithm, int* protocol, int* nChannels);
  hsNcclResult (*destroy)(void* context);
} hsTunerV2;

typedef struct {
  const char* name;
  hsNcclResult (*init)(size_t nRanks, size_t nNodes, hsNcclLogger logFunction, void** context);
  hsNcclResult (*getCollInfo)(void* context, hsNcclFunc collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  hsNcclResult (*destroy)(void* context);
} hsTunerV3;

typedef struct {
  const char* name;
  hsNcclResult (*init)(size_t nRanks, size_t nNodes, hsNcclLogger logFunction, void** context);
  hsNcclResult (*getCollInfo)(void* context, hsNcclFunc collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  hsNcclResult (*destroy)(void* context);
} hsTunerV4;

/* v5/v6 extras: NVLink-domain information and tunable constants (we read neither). */
typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} hsNvlDomainInfoV5;

typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} hsTunerConstantsV5;

typedef struct {
  const char* name;
  hsNcclResult (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                       hsNcclLogger logFunction, hsNvlDomainInfoV5* nvlDomainInfo,
                       hsTunerConstantsV5* constants);
  hsNcclResult (*getCollInfo)(void* context, hsNcclFunc collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  hsNcclResult (*finalize)(void* context);
} hsTunerV5;

typedef struct {
  const char* name;
  hsNcclResult (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                       hsNcclLogger logFunction, hsNvlDomainInfoV5* nvlDomainInfo,
                       hsTunerConstantsV5* constants);
  hsNcclResult (*getCollInfo)(void* context, hsNcclFunc collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  hsNcclResult (*finalize)(void* context);
  hsNcclResult (*getChunkSize)(void* context, hsNcclFunc collType, size_t nBytes, int algo,
                               int proto, int nChannels, size_t* chunkSize);
} hsTunerV6;

/* Exported symbol names NCCL looks up, newest first. */
#define HS_TUNER_SYMBOL_V6 "ncclTunerPlugin_v6"
#define HS_TUNER_SYMBOL_V5 "ncclTunerPlugin_v5"
#define HS_TUNER_SYMBOL_V4 "ncclTunerPlugin_v4"
#define HS_TUNER_SYMBOL_V3 "ncclTunerPlugin_v3"
#define HS_TUNER_SYMBOL_V2 "ncclTunerPlugin_v2"

/* Extra entry points of our plugin for tests and the agent (not part of NCCL's ABI):
 * statistics of one context. */
typedef struct {
  uint64_t selections;       /* AllReduce collectives scheduled */
  uint64_t fallbacks;        /* left to NCCL (no table, unsupported algorithm) */
  uint64_t table_version;    /* version in force */
  uint64_t seq;              /* next collective sequence number */
  uint32_t last_policy_id;
  int last_algorithm;        /* -1 when none */
  uint64_t stalled;          /* AllReduces decided while the segment's seqlock stayed held past
                                the wait bound (writer died mid-publish): decided from the
                                tables already held, NCCL's defaults when none */
  uint64_t refused;          /* segment reads refused by this context: garbled, truncated,
                                foreign or resized too often, a declared length above the
                                payload limit, or not a table list */
  uint64_t parsed;           /* payloads this context copied, checked and parsed on its own
                                calls: at most one per publish of new bytes, and on a
                                collective only payloads of at most 64 KiB */
  uint64_t reader_parsed;    /* payloads the group's reader thread parsed (longer ones a
                                collective handed over), shared by the group's contexts */
} hsTunerStats;
int heroserveTunerStats(void* context, hsTunerStats* out);

#ifdef __cplusplus
}
#endif

#endif /* HEROSERVE_NCCL_TUNER_ABI_H_ */
