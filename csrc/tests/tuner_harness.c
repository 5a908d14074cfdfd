/* Test harness for libnccl-tuner-heroserve.so, in C as NCCL would load it.
 *
 * dlopens the plugin, finds every ncclTunerPlugin_v2..v6 symbol, publishes a policy table
 * into shared memory (through the policy core's C API, as the daemon does), and checks that
 *  - getCollInfo on an AllReduce makes the algorithm of the policy the core selects the
 *    cheapest entry of an NCCL-shaped cost table float[7][3] (oracle: the same core run
 *    through libheroserve_policy.so on the same table and sizes);
 *  - two simulated ranks with the same table version make the same choices;
 *  - a new version takes effect exactly at its apply_from_seq;
 *  - other collectives, a missing segment and unsupported algorithms leave NCCL's table as is;
 *  - a single-rank communicator (TP=1, no table by contract) is left to NCCL.
 * Usage: tuner_harness <plugin.so> <libheroserve_policy.so>. Exit 0 when all checks pass. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_tuner_abi.h"

typedef struct hs_scheduler hs_scheduler;
typedef int (*publish_fn)(const char*, const char*, char*, size_t);
typedef hs_scheduler* (*sched_new_fn)(void*);
typedef void (*sched_free_fn)(hs_scheduler*);
typedef int (*install_fn)(hs_scheduler*, const char*, char*, size_t);
typedef int (*select_fn)(hs_scheduler*, double, uint32_t*, double*);
typedef int (*stats_fn)(void*, hsTunerStats*);

static int failures = 0;
#define CHECK(cond, ...)                                \
  do {                                                  \
    if (!(cond)) {                                      \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                     \
      fprintf(stderr, "\n");                            \
      ++failures;                                       \
    }                                                   \
  } while (0)

static publish_fn publish;
static sched_new_fn sched_new;
static sched_free_fn sched_free;
static install_fn install;
static select_fn select_policy;

/* Three policies: INA (id 0, 400 Gb/s), ring (id 1, 200 Gb/s), NVLS (id 4, 900 Gb/s but
 * sharing the NVLink with ring). Version and first sequence are parameters. */
static void table_json(char* buf, size_t n, int version, int apply_from, double ina_cost) {
  snprintf(buf, n,
           "{\"group_id\": \"decode/0/0\", \"version\": %d, \"apply_from_seq\": %d,"
           " \"window_s\": 0.001, \"gamma\": 0.5,"
           " \"links\": [{\"id\": \"g0|s1\", \"capacity\": 50000000000.0},"
           "   {\"id\": \"g0|g1\", \"capacity\": 25000000000.0},"
           "   {\"id\": \"g0|nvs\", \"capacity\": 112500000000.0}],"
           " \"policies\": ["
           "   {\"id\": 0, \"scheme\": \"ina\", \"switch\": \"s1\", \"links\": [\"g0|s1\"], \"cost\": %g},"
           "   {\"id\": 1, \"scheme\": \"ring\", \"links\": [\"g0|g1\", \"g0|nvs\"], \"cost\": 0.0},"
           "   {\"id\": 4, \"scheme\": \"nvls\", \"links\": [\"g0|nvs\"], \"cost\": 0.05}],"
           " \"utilisation\": {\"g0|nvs\": 0.3, \"g0|g1\": 0.1}}",
           version, apply_from, ina_cost);
}

static void nccl_costs(float t[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS], int collnet, int nvls) {
  for (int a = 0; a < HS_NUM_ALGORITHMS; ++a)
    for (int p = 0; p < HS_NUM_PROTOCOLS; ++p) t[a][p] = 10.0f + (float)(a * 3 + p);
  t[HS_ALGO_RING][HS_PROTO_LL] = 5.0f; /* NCCL's own favourite */
  if (!collnet) {
    for (int p = 0; p < HS_NUM_PROTOCOLS; ++p) {
      t[HS_ALGO_COLLNET_DIRECT][p] = HS_ALGO_PROTO_IGNORE;
      t[HS_ALGO_COLLNET_CHAIN][p] = HS_ALGO_PROTO_IGNORE;
    }
  }
  if (!nvls) {
    for (int p = 0; p < HS_NUM_PROTOCOLS; ++p) {
      t[HS_ALGO_NVLS][p] = HS_ALGO_PROTO_IGNORE;
      t[HS_ALGO_NVLS_TREE][p] = HS_ALGO_PROTO_IGNORE;
    }
  }
}

static int cheapest_algo(float t[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS]) {
  int best = -1;
  float bc = 0;
  for (int a = 0; a < HS_NUM_ALGORITHMS; ++a)
    for (int p = 0; p < HS_NUM_PROTOCOLS; ++p)
      if (t[a][p] >= 0 && (best < 0 || t[a][p] < bc)) {
        best = a;
        bc = t[a][p];
      }
  return best;
}

static int algo_for_policy(uint32_t id) {
  return id == 0 ? HS_ALGO_COLLNET_CHAIN : id == 1 ? HS_ALGO_RING : HS_ALGO_NVLS; /* flat INA */
}

static const size_t kSizes[] = {4096, 65536, 1 << 20, 8 << 20, 64 << 20, 256 << 20, 12345, 3 << 20};
#define NSIZES (sizeof kSizes / sizeof kSizes[0])

typedef hsNcclResult (*getinfo_v4)(void*, hsNcclFunc, size_t, int, float**, int, int, int, int*);

/* Drives two ranks through `rounds` AllReduces of the size sequence with the v4-shaped
 * getCollInfo and checks them against the oracle scheduler. */
static void run_ranks(const char* tag, void* ctx0, void* ctx1, getinfo_v4 info,
                      hs_scheduler* oracle, int rounds) {
  int nch = 0;
  for (int r = 0; r < rounds; ++r) {
    size_t n = kSizes[r % NSIZES];
    float t0[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS], t1[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
    nccl_costs(t0, 1, 1);
    nccl_costs(t1, 1, 1);
    CHECK(info(ctx0, HS_NCCL_FUNC_ALLREDUCE, n, 1, (float**)t0, HS_NUM_ALGORITHMS,
               HS_NUM_PROTOCOLS, 0, &nch) == HS_NCCL_SUCCESS, "%s getCollInfo rank 0", tag);
    CHECK(info(ctx1, HS_NCCL_FUNC_ALLREDUCE, n, 1, (float**)t1, HS_NUM_ALGORITHMS,
               HS_NUM_PROTOCOLS, 0, &nch) == HS_NCCL_SUCCESS, "%s getCollInfo rank 1", tag);
    uint32_t want = 0;
    double cost = 0;
    CHECK(select_policy(oracle, (double)n, &want, &cost) == 0, "%s oracle select", tag);
    int a0 = cheapest_algo(t0), a1 = cheapest_algo(t1);
    CHECK(a0 == a1, "%s round %d: ranks disagree (%d vs %d)", tag, r, a0, a1);
    CHECK(a0 == algo_for_policy(want), "%s round %d size %zu: algorithm %d, policy %u wants %d",
          tag, r, n, a0, want, algo_for_policy(want));
  }
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s <libnccl-tuner-heroserve.so> <libheroserve_policy.so>\n", argv[0]);
    return 2;
  }
  char prefix[64];
  snprintf(prefix, sizeof prefix, "harness%d.", (int)getpid());
  setenv("HEROSERVE_SHM_PREFIX", prefix, 1);
  setenv("HEROSERVE_GROUP", "decode/0/0", 1);
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_PROTO");

  void* core = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!core) {
    fprintf(stderr, "dlopen %s: %s\n", argv[2], dlerror());
    return 1;
  }
  publish = (publish_fn)dlsym(core, "hs_shm_publish_json");
  sched_new = (sched_new_fn)dlsym(core, "hs_scheduler_new");
  sched_free = (sched_free_fn)dlsym(core, "hs_scheduler_free");
  install = (install_fn)dlsym(core, "hs_scheduler_install_json");
  select_policy = (select_fn)dlsym(core, "hs_scheduler_select");
  if (!publish || !sched_new || !sched_free || !install || !select_policy) {
    fprintf(stderr, "policy core C API symbols missing\n");
    return 1;
  }

  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  const hsTunerV6* v6 = (const hsTunerV6*)dlsym(lib, HS_TUNER_SYMBOL_V6);
  const hsTunerV5* v5 = (const hsTunerV5*)dlsym(lib, HS_TUNER_SYMBOL_V5);
  const hsTunerV4* v4 = (const hsTunerV4*)dlsym(lib, HS_TUNER_SYMBOL_V4);
  const hsTunerV3* v3 = (const hsTunerV3*)dlsym(lib, HS_TUNER_SYMBOL_V3);
  const hsTunerV2* v2 = (const hsTunerV2*)dlsym(lib, HS_TUNER_SYMBOL_V2);
  stats_fn stats = (stats_fn)dlsym(lib, "heroserveTunerStats");
  CHECK(v6 && v5 && v4 && v3 && v2 && stats, "tuner symbols missing");
  if (failures) return 1;
  CHECK(strcmp(v6->name, "HeroServe") == 0, "plugin name %s", v6->name);
  CHECK(dlsym(lib, "hs_scheduler_new") == NULL, "plugin leaks core symbols");

  /* 1. No segment yet: NCCL's table untouched, success returned. */
  void* c0 = NULL;
  CHECK(v6->init(&c0, 42, 2, 1, NULL, NULL, NULL) == HS_NCCL_SUCCESS && c0, "v6 init");
  {
    float t[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS], ref[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
    nccl_costs(t, 1, 1);
    memcpy(ref, t, sizeof t);
    int nch = 0;
    CHECK(v6->getCollInfo(c0, HS_NCCL_FUNC_ALLREDUCE, 1 << 20, 1, (float**)t, HS_NUM_ALGORITHMS,
                          HS_NUM_PROTOCOLS, 0, &nch) == HS_NCCL_SUCCESS, "no-segment call");
    CHECK(memcmp(t, ref, sizeof t) == 0, "no segment: cost table must be left alone");
  }
  v6->finalize(c0);

  /* 2. Publish version 1 and drive two ranks through v6 and v4 entry points. */
  char t1[2048], t2[2048], err[256];
  table_json(t1, sizeof t1, 1, 0, 0.0);
  char doc[8192];
  snprintf(doc, sizeof doc, "{\"tables\": [%s]}", t1);
  CHECK(publish("decode/0/0", doc, err, sizeof err) == 0, "publish: %s", err);

  void *r0 = NULL, *r1 = NULL;
  CHECK(v6->init(&r0, 42, 2, 1, NULL, NULL, NULL) == HS_NCCL_SUCCESS, "v6 init rank 0");
  CHECK(v6->init(&r1, 42, 2, 1, NULL, NULL, NULL) == HS_NCCL_SUCCESS, "v6 init rank 1");
  hs_scheduler* oracle = sched_new(NULL);
  CHECK(install(oracle, t1, err, sizeof err) == 1, "oracle install: %s", err);
  run_ranks("v6", r0, r1, (getinfo_v4)v6->getCollInfo, oracle, 24);

  /* Other collectives: untouched and do not advance the sequence. */
  {
    float t[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS], ref[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
    nccl_costs(t, 1, 1);
    memcpy(ref, t, sizeof t);
    int nch = 0;
    v6->getCollInfo(r0, 2 /* AllGather */, 1 << 20, 1, (float**)t, HS_NUM_ALGORITHMS,
                    HS_NUM_PROTOCOLS, 0, &nch);
    v6->getCollInfo(r1, 2, 1 << 20, 1, (float**)t, HS_NUM_ALGORITHMS, HS_NUM_PROTOCOLS, 0, &nch);
    CHECK(memcmp(t, ref, sizeof t) == 0, "AllGather must be left to NCCL");
  }

  /* 3. Version 2 (INA made expensive) applies from sequence 30: ranks switch there. */
  table_json(t2, sizeof t2, 2, 30, 100.0);
  snprintf(doc, sizeof doc, "{\"tables\": [%s, %s]}", t1, t2);
  CHECK(publish("decode/0/0", doc, err, sizeof err) == 0, "publish v2: %s", err);
  CHECK(install(oracle, t2, err, sizeof err) == 1, "oracle install v2: %s", err);
  run_ranks("v6-switch", r0, r1, (getinfo_v4)v6->getCollInfo, oracle, 6);
  hsTunerStats st;
  stats(r0, &st);
  CHECK(st.table_version == 1 && st.seq == 30, "before boundary: version %llu seq %llu",
        (unsigned long long)st.table_version, (unsigned long long)st.seq);
  run_ranks("v6-after", r0, r1, (getinfo_v4)v6->getCollInfo, oracle, 10);
  stats(r1, &st);
  CHECK(st.table_version == 2 && st.seq == 40 && st.selections == 40,
        "after boundary: version %llu seq %llu", (unsigned long long)st.table_version,
        (unsigned long long)st.seq);
  v6->finalize(r0);
  v6->finalize(r1);
  sched_free(oracle);

  /* 4. Older ABIs: v4 and v5 through the same checks (fresh contexts start at sequence 0). */
  oracle = sched_new(NULL);
  install(oracle, t1, err, sizeof err);
  install(oracle, t2, err, sizeof err);
  CHECK(v4->init(2, 1, NULL, &r0) == HS_NCCL_SUCCESS, "v4 init");
  CHECK(v5->init(&r1, 7, 2, 1, NULL, NULL, NULL) == HS_NCCL_SUCCESS, "v5 init");
  run_ranks("v4/v5", r0, r1, (getinfo_v4)v4->getCollInfo, oracle, 40);
  v4->destroy(r0);
  v5->finalize(r1);
  sched_free(oracle);

  /* 5. v3 and v2 entry points, and an unsupported algorithm (no CollNet) left to NCCL. */
  CHECK(v3->init(2, 1, NULL, &r0) == HS_NCCL_SUCCESS, "v3 init");
  {
    float t[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS], ref[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
    nccl_costs(t, 0, 1); /* first choice under v1 is INA (policy 0): no CollNet here */
    memcpy(ref, t, sizeof t);
    int nch = 0;
    v3->getCollInfo(r0, HS_NCCL_FUNC_ALLREDUCE, 1 << 20, 1, (float**)t, HS_NUM_ALGORITHMS,
                    HS_NUM_PROTOCOLS, &nch);
    stats(r0, &st);
    CHECK(st.last_policy_id == 0 && st.fallbacks == 1, "v3: policy %u fallbacks %llu",
          st.last_policy_id, (unsigned long long)st.fallbacks);
    CHECK(memcmp(t, ref, sizeof t) == 0, "unsupported CollNet: table must be left alone");
  }
  v3->destroy(r0);
  CHECK(v2->init(2, 1, NULL, &r0) == HS_NCCL_SUCCESS, "v2 init");
  {
    int algo = -1, proto = -1, nch = 0;
    v2->getCollInfo(r0, HS_NCCL_FUNC_ALLREDUCE, 1 << 20, 1, 1, 1, &algo, &proto, &nch);
    CHECK(algo == HS_ALGO_COLLNET_CHAIN && proto == HS_PROTO_SIMPLE, "v2: algo %d proto %d",
          algo, proto);
    algo = proto = -1;
    v2->getCollInfo(r0, 2, 1 << 20, 1, 1, 1, &algo, &proto, &nch);
    CHECK(algo == -1 && proto == -1, "v2: AllGather must be left to NCCL");
  }
  v2->destroy(r0);

  /* 6. A garbled table in the segment: the last good table stays in force. */
  CHECK(v6->init(&r0, 1, 2, 1, NULL, NULL, NULL) == HS_NCCL_SUCCESS, "v6 init");
  {
    float t[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
    int nch = 0;
    nccl_costs(t, 1, 1);
    v6->getCollInfo(r0, HS_NCCL_FUNC_ALLREDUCE, 4096, 1, (float**)t, HS_NUM_ALGORITHMS,
                    HS_NUM_PROTOCOLS, 0, &nch);
    CHECK(publish("decode/0/0", "{\"tables\": [{\"group_id\": \"decode/0/0\"}]}", err,
                  sizeof err) != 0, "core must refuse to publish a malformed table");
    stats(r0, &st);
    CHECK(st.table_version == 1 && st.selections == 1, "garbled: version %llu",
          (unsigned long long)st.table_version);
  }
  v6->finalize(r0);

  /* 7. A single-rank communicator (TP=1: the controller publishes no table for it) leaves
   *    NCCL's table alone even though the group's segment holds a table, and selects nothing. */
  {
    void* one = NULL;
    CHECK(v6->init(&one, 5, 1, 1, NULL, NULL, NULL) == HS_NCCL_SUCCESS && one, "v6 init 1 rank");
    float t[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS], ref[HS_NUM_ALGORITHMS][HS_NUM_PROTOCOLS];
    nccl_costs(t, 1, 1);
    memcpy(ref, t, sizeof t);
    int nch = 0;
    CHECK(v6->getCollInfo(one, HS_NCCL_FUNC_ALLREDUCE, 1 << 20, 1, (float**)t, HS_NUM_ALGORITHMS,
                          HS_NUM_PROTOCOLS, 0, &nch) == HS_NCCL_SUCCESS, "1-rank call");
    CHECK(memcmp(t, ref, sizeof t) == 0, "1 rank: cost table must be left alone");
    stats(one, &st);
    CHECK(st.selections == 0 && st.table_version == 0, "1 rank: selections %llu version %llu",
          (unsigned long long)st.selections, (unsigned long long)st.table_version);
    CHECK(v6->finalize(one) == HS_NCCL_SUCCESS, "1-rank finalize");
  }

  char shm_path[256];
  snprintf(shm_path, sizeof shm_path, "/dev/shm/heroserve-%sdecode.0.0", prefix);
  unlink(shm_path);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("tuner harness: all checks passed (v2..v6, 2 ranks, version switch at seq 30)\n");
  return 0;
}
