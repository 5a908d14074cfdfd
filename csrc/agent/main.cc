// heroserve-gpu-agent command line. Usage errors: a message and exit status 2.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "daemon.h"

namespace {

const char* kUsage =
    "usage: heroserve-gpu-agent --controller HOST:PORT --node-id NODE\n"
    "         [--gpu GPU_ID[:CUDA_INDEX]]... [--tls-ca PEM --tls-cert PEM --tls-key PEM]\n"
    "         [--tls-server-name NAME] [--insecure] [--nvlink-peer NODE]\n"
    "         [--telemetry-interval SECONDS] [--shm-capacity BYTES]\n"
    "Publishes the controller's policy tables for the NCCL tuner plugin in POSIX shm\n"
    "(/dev/shm/heroserve-<group>; HEROSERVE_SHM_PREFIX adds a prefix).\n";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "heroserve-gpu-agent: %s\n%s", msg.c_str(), kUsage);
  return 2;
}

bool ParseDouble(const char* s, double* out) {
  char* end = nullptr;
  *out = std::strtod(s, &end);
  return end && *end == '\0' && end != s;
}

}  // namespace

int main(int argc, char** argv) {
  heroserve::agent::Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--insecure") {
      o.insecure = true;
    } else if (!value(&v)) {
      return Usage(a.rfind("--", 0) == 0 ? a + " needs a value" : "unexpected argument " + a);
    } else if (a == "--controller") {
      o.controller = v;
    } else if (a == "--node-id") {
      o.node_id = v;
    } else if (a == "--gpu") {
      heroserve::agent::GpuSpec g;
      auto colon = v.rfind(':');
      g.gpu_id = v.substr(0, colon);
      if (colon != std::string::npos) {
        double idx = 0;
        if (!ParseDouble(v.c_str() + colon + 1, &idx) || idx < 0 || idx > 1024) {
          return Usage("--gpu " + v + ": CUDA index must be a small non-negative integer");
        }
        g.local_index = static_cast<int>(idx);
      }
      if (g.gpu_id.empty()) return Usage("--gpu needs a GPU id");
      o.gpus.push_back(g);
    } else if (a == "--tls-ca") {
      o.tls_ca = v;
    } else if (a == "--tls-cert") {
      o.tls_cert = v;
    } else if (a == "--tls-key") {
      o.tls_key = v;
    } else if (a == "--tls-server-name") {
      o.tls_server_name = v;
    } else if (a == "--nvlink-peer") {
      o.nvlink_peer = v;
    } else if (a == "--telemetry-interval") {
      if (!ParseDouble(v.c_str(), &o.telemetry_interval_s) || !(o.telemetry_interval_s > 0)) {
        return Usage("--telemetry-interval must be a positive number of seconds");
      }
    } else if (a == "--shm-capacity") {
      double cap = 0;
      if (!ParseDouble(v.c_str(), &cap) || cap < 4096 || cap > (1ull << 30)) {
        return Usage("--shm-capacity must be between 4096 and 2^30 bytes");
      }
      o.shm_capacity = static_cast<size_t>(cap);
    } else {
      return Usage("unknown option " + a);
    }
  }
  if (o.controller.empty()) return Usage("--controller is required");
  if (o.node_id.empty()) return Usage("--node-id is required");
  int tls = !o.tls_ca.empty() + !o.tls_cert.empty() + !o.tls_key.empty();
  if (tls != 0 && tls != 3) return Usage("give all of --tls-ca, --tls-cert and --tls-key");
  std::string host = o.controller.substr(0, o.controller.rfind(':'));
  bool loopback = host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
  if (tls == 0 && !loopback && !o.insecure) {
    return Usage("refusing to talk to " + o.controller +
                 " without TLS: give --tls-ca/--tls-cert/--tls-key or --insecure");
  }

  // Signals go to a dedicated thread (sigwait), which stops the daemon cleanly.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  heroserve::agent::Daemon daemon(o);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    heroserve::agent::Log("INFO", std::string("signal ") + std::to_string(sig) + ", stopping");
    daemon.Stop();
  });
  int rc = daemon.Run();
  // Wake the waiter if Run ended on its own.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return rc;
}
