// Shared by the dlopen harnesses (collnet_harness.cc, net_harness.cc): the clock, the data
// hash, NCCL's logger callback, the options both take (--lib --dir --rank --nranks
// --version --sizes --seed --exchange-timeout), the out-of-band handle exchange through
// files in --dir (as NCCL's bootstrap allgather would carry them) and the error line.
#pragma once

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "nccl_net_abi.h"

namespace harness {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline void Logger(ncclDebugLogLevel level, unsigned long, const char* file, int line,
                   const char* fmt, ...) {
  if (level > NCCL_LOG_INFO) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[plugin %s %s:%d] %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", file, line,
          msg);
}

inline std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

// The options every harness takes; each harness checks their ranges itself.
struct CommonArgs {
  std::string lib, dir;
  int rank = -1, nranks = 0, version = 12;
  std::vector<size_t> sizes;
  uint64_t seed = 1;
  double exchange_timeout_s = 60;
};

// Consumes argv[*i] (and its value, advancing *i) when it is a common option.
inline bool ParseCommon(int argc, char** argv, int* i, CommonArgs* a) {
  std::string k = argv[*i];
  auto val = [&]() -> std::string { return *i + 1 < argc ? argv[++*i] : ""; };
  if (k == "--lib") a->lib = val();
  else if (k == "--dir") a->dir = val();
  else if (k == "--rank") a->rank = std::atoi(val().c_str());
  else if (k == "--nranks") a->nranks = std::atoi(val().c_str());
  else if (k == "--version") a->version = std::atoi(val().c_str());
  else if (k == "--sizes") {
    for (auto& s : Split(val())) a->sizes.push_back(std::strtoull(s.c_str(), nullptr, 10));
  } else if (k == "--seed") a->seed = std::strtoull(val().c_str(), nullptr, 10);
  else if (k == "--exchange-timeout") a->exchange_timeout_s = std::atof(val().c_str());
  else return false;
  return true;
}

inline bool CommonValid(const CommonArgs& a) {
  return !a.lib.empty() && !a.dir.empty() && a.rank >= 0 && a.nranks > 0 && a.rank < a.nranks;
}

// DIR/<prefix>.RANK, written whole (tmp + rename) so a reader never sees a part.
inline bool WriteHandle(const CommonArgs& a, const char* prefix, const char* h) {
  std::string fin = a.dir + "/" + prefix + "." + std::to_string(a.rank);
  std::string tmp = fin + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = fwrite(h, 1, NCCL_NET_HANDLE_MAXSIZE, f) == NCCL_NET_HANDLE_MAXSIZE;
  ok = fclose(f) == 0 && ok;
  return ok && rename(tmp.c_str(), fin.c_str()) == 0;
}

// Rank r's handle, waited for at most --exchange-timeout seconds from `deadline`'s start.
inline bool ReadHandle(const CommonArgs& a, const char* prefix, int r, double deadline,
                       char* out) {
  std::string p = a.dir + "/" + prefix + "." + std::to_string(r);
  for (;;) {
    FILE* f = fopen(p.c_str(), "rb");
    if (f != nullptr) {
      size_t n = fread(out, 1, NCCL_NET_HANDLE_MAXSIZE, f);
      fclose(f);
      if (n == NCCL_NET_HANDLE_MAXSIZE) return true;
    }
    if (Now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The error line of a failed plugin call; the harness exits 3 with it.
inline int Fail(const char* stage, ncclResult_t rc, double t0) {
  printf("{\"event\": \"error\", \"stage\": \"%s\", \"rc\": %d, \"seconds\": %.3f}\n", stage,
         static_cast<int>(rc), Now() - t0);
  fflush(stdout);
  return 3;
}

}  // namespace harness
