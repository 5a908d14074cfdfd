/* A stand-in libnvidia-ml.so.1 for the GPU agent's tests on machines without a GPU: the few
 * NVML entry points the agent calls (csrc/agent/nvml.cc), with NVML's signatures and field
 * ids. Four GPUs, 4 active NVLinks of 25,000 MB/s each (1e11 B/s a GPU); GPU k sends and
 * receives (k + 1) * 1e9 B/s, counted from the clock, so its utilisation is (k + 1) / 100. */
#include <string.h>
#include <time.h>

typedef struct {
  unsigned fieldId, scopeId;
  long long timestamp, latencyUsec;
  int valueType, nvmlReturn;
  union {
    double d;
    unsigned ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
  } value;
} FieldValue;

typedef struct {
  unsigned long long total, free, used;
} Memory;

static long dev[4];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 4; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
  if (i >= 4) return 2;
  *h = &dev[i];
  return 0;
}
int nvmlDeviceGetName(void *h, char *buf, unsigned n) {
  (void)h;
  strncpy(buf, "Fake A100", n);
  return 0;
}
int nvmlDeviceGetMemoryInfo(void *h, Memory *m) {
  (void)h;
  m->total = 40ULL << 30;
  return 0;
}
int nvmlDeviceGetNvLinkState(void *h, unsigned link, int *active) {
  (void)h;
  *active = link < 4;
  return 0;
}
int nvmlDeviceGetFieldValues(void *h, int n, FieldValue *f) {
  long k = (long *)h - dev;
  for (int i = 0; i < n; ++i) {
    f[i].nvmlReturn = 0;
    if (f[i].fieldId == 90) {
      f[i].value.ui = 25000; /* MB/s per link */
    } else if ((f[i].fieldId == 138 || f[i].fieldId == 139) && f[i].scopeId < 4) {
      /* KiB on this link: a quarter of the GPU's traffic on each of its 4 links */
      f[i].value.ull = (unsigned long long)(now_s() * (double)(k + 1) * 1e9 / 4.0 / 1024.0);
    } else {
      f[i].nvmlReturn = 2; /* NVML_ERROR_INVALID_ARGUMENT: no such link */
    }
  }
  return 0;
}
