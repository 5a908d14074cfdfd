// heroserve-gpu-agent command line (getopt_long: --opt value and --opt=value). A usage error
// is one line on stderr naming the problem, and exit status 2.
#include <getopt.h>
#include <signal.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "address.h"
#include "daemon.h"
#include "heroserve/ina_wire.h"
#include "heroserve/log.h"

#ifndef HEROSERVE_VERSION
#error "HEROSERVE_VERSION comes from pyproject.toml through CMake"
#endif

namespace {

namespace agent = heroserve::agent;
namespace hlog = heroserve::log;

constexpr const char* kProg = "heroserve-gpu-agent";
constexpr double kMaxTelemetryIntervalS = 3600.0;
constexpr unsigned long long kMinShmCapacity = 4096;
constexpr int kMaxCudaIndex = 1024;
constexpr uint16_t kInaPort = static_cast<uint16_t>(heroserve::ina::INA_UDP_PORT);

void PrintHelp() {
  std::printf(
      "usage: %s --controller HOST:PORT --node-id NODE [options]\n"
      "\n"
      "Registers this server's GPUs with the HeroServe controller, publishes its policy tables\n"
      "for the NCCL tuner plugin in POSIX shared memory (/dev/shm/heroserve-<group>;\n"
      "HEROSERVE_SHM_PREFIX adds a prefix) and reports the plugin's selections and NVLink\n"
      "utilisation. Options take their value as --opt VALUE or --opt=VALUE.\n"
      "\n"
      "  --controller HOST:PORT     the controller (required); IPv6 as [ADDRESS]:PORT\n"
      "                             (HEROSERVE_CONTROLLER when absent; so are --tls-ca,\n"
      "                             --tls-cert, --tls-key: HEROSERVE_TLS_CA, _CERT, _KEY)\n"
      "  --node-id NODE             this server's node id in the topology (required)\n"
      "  --gpu GPU_ID[:CUDA_INDEX]  a GPU of this server, repeatable (default: none)\n"
      "  --tls-ca PEM               CA that signs the controller's certificate\n"
      "  --tls-cert PEM             this agent's certificate (mutual TLS)\n"
      "  --tls-key PEM              its private key; give all three TLS files or none\n"
      "  --tls-server-name NAME     name to check on the controller's certificate\n"
      "                             (default: HOST of --controller)\n"
      "  --insecure                 allow no TLS to a controller off loopback (default: only\n"
      "                             127.0.0.0/8, ::1 and localhost without TLS)\n"
      "  --nvlink-peer NODE         far end of each GPU's NVLink in link ids\n"
      "                             (default: NODE-nvsw, the topology's NVSwitch)\n"
      "  --nvlink-mesh              the GPUs are joined pairwise (a mesh board, no NVSwitch):\n"
      "                             report each pair's link of the --gpu GPUs instead\n"
      "  --telemetry-interval S     seconds between reports, in (0, %.0f]\n"
      "                             (default: the controller's, 1 s if it names none)\n"
      "  --shm-capacity BYTES       payload bytes per group segment, %llu..%llu\n"
      "                             (default: %zu)\n"
      "  --ina-config PATH          write this server's INA groups there for the CollNet\n"
      "                             plugin (the engines' HEROSERVE_INA_CONFIG; default: none)\n"
      "  --ina-switch NAME=IPV4[:PORT]  where INA traffic to switch NAME is sent from this\n"
      "                             server, repeatable (port default 48879)\n"
      "  --ina-bind IPV4[:PORT]     local address the plugin binds (default 0.0.0.0:48879)\n"
      "  --log-format FORMAT        text or json (default: text)\n"
      "  --log-level LEVEL          DEBUG, INFO, WARNING or ERROR (default: INFO)\n"
      "  --version                  print the version and exit\n"
      "  -h, --help                 print this help and exit\n",
      kProg, kMaxTelemetryIntervalS, kMinShmCapacity,
      static_cast<unsigned long long>(heroserve::shm::kMaxPayloadBytes),
      heroserve::shm::kDefaultCapacity);
}

// An absent flag takes its HEROSERVE_* variable (docs/control-plane.md, "Environment"); a flag
// given wins, an empty variable counts as unset. Returns the name an error cites; a value
// with a control character (it would forge a log line) makes *bad true.
std::string FromEnv(std::string* value, const char* flag, const char* var, bool* bad) {
  if (!value->empty()) return flag;
  const char* e = std::getenv(var);
  if (e == nullptr) return var;
  for (const char* c = e; *c; ++c) {
    if (static_cast<unsigned char>(*c) < 0x20 || *c == 0x7f) *bad = true;
  }
  *value = e;
  return var;
}

int Usage(const std::string& msg) {
  std::fprintf(stderr, "%s: error: %s (see %s --help)\n", kProg, msg.c_str(), kProg);
  return 2;
}

bool ParseUnsigned(const char* s, unsigned long long max, unsigned long long* out) {
  if (!s || *s < '0' || *s > '9') return false;  // no sign, no blank, no empty
  errno = 0;
  char* end = nullptr;
  *out = std::strtoull(s, &end, 10);
  return errno == 0 && end && *end == '\0' && *out <= max;
}

bool ParseSeconds(const char* s, double* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  *out = std::strtod(s, &end);
  return end && *end == '\0' && std::isfinite(*out) && *out > 0 &&
         *out <= kMaxTelemetryIntervalS;
}

enum OptionId {
  kController = 1000,
  kNodeId,
  kGpu,
  kTlsCa,
  kTlsCert,
  kTlsKey,
  kTlsServerName,
  kInsecure,
  kNvlinkPeer,
  kNvlinkMesh,
  kTelemetryInterval,
  kShmCapacity,
  kLogFormat,
  kLogLevel,
  kVersion,
  kInaConfig,
  kInaSwitch,
  kInaBind,
};

const struct option kOptions[] = {
    {"controller", required_argument, nullptr, kController},
    {"node-id", required_argument, nullptr, kNodeId},
    {"gpu", required_argument, nullptr, kGpu},
    {"tls-ca", required_argument, nullptr, kTlsCa},
    {"tls-cert", required_argument, nullptr, kTlsCert},
    {"tls-key", required_argument, nullptr, kTlsKey},
    {"tls-server-name", required_argument, nullptr, kTlsServerName},
    {"insecure", no_argument, nullptr, kInsecure},
    {"nvlink-peer", required_argument, nullptr, kNvlinkPeer},
    {"nvlink-mesh", no_argument, nullptr, kNvlinkMesh},
    {"telemetry-interval", required_argument, nullptr, kTelemetryInterval},
    {"shm-capacity", required_argument, nullptr, kShmCapacity},
    {"log-format", required_argument, nullptr, kLogFormat},
    {"log-level", required_argument, nullptr, kLogLevel},
    {"version", no_argument, nullptr, kVersion},
    {"ina-config", required_argument, nullptr, kInaConfig},
    {"ina-switch", required_argument, nullptr, kInaSwitch},
    {"ina-bind", required_argument, nullptr, kInaBind},
    {"help", no_argument, nullptr, 'h'},
    {nullptr, 0, nullptr, 0},
};

// The option as the user wrote it (for messages): argv's word up to any '='.
std::string Spelled(char** argv, int index) {
  std::string w = index > 0 && argv[index - 1] ? argv[index - 1] : "?";
  return w.substr(0, w.find('='));
}

}  // namespace

int main(int argc, char** argv) {
  agent::Options o;
  o.ina.bind.port = kInaPort;
  hlog::Level level = hlog::Level::kInfo;
  hlog::Format format = hlog::Format::kText;
  opterr = 0;  // our own one-line messages
  int c = 0;
  // '+': stop at the first non-option (reported below); ':': a missing value returns ':'.
  while ((c = getopt_long(argc, argv, "+:h", kOptions, nullptr)) != -1) {
    const std::string v = optarg ? optarg : "";
    switch (c) {
      case 'h':
        PrintHelp();
        return 0;
      case kVersion:
        std::printf("%s %s\n", kProg, HEROSERVE_VERSION);
        return 0;
      case kController: o.controller = v; break;
      case kNodeId: o.node_id = v; break;
      case kGpu: {
        agent::GpuSpec g;
        auto colon = v.rfind(':');
        g.gpu_id = v.substr(0, colon);
        if (colon != std::string::npos) {
          unsigned long long idx = 0;
          if (!ParseUnsigned(v.c_str() + colon + 1, kMaxCudaIndex, &idx)) {
            return Usage("--gpu " + v + ": the CUDA index must be an integer from 0 to " +
                         std::to_string(kMaxCudaIndex));
          }
          g.local_index = static_cast<int>(idx);
        }
        if (g.gpu_id.empty()) return Usage("--gpu " + v + ": the GPU id is empty");
        o.gpus.push_back(g);
        break;
      }
      case kTlsCa: o.tls_ca = v; break;
      case kTlsCert: o.tls_cert = v; break;
      case kTlsKey: o.tls_key = v; break;
      case kTlsServerName: o.tls_server_name = v; break;
      case kInsecure: o.insecure = true; break;
      case kNvlinkPeer: o.nvlink_peer = v; break;
      case kNvlinkMesh: o.nvlink_mesh = true; break;
      case kTelemetryInterval:
        if (!ParseSeconds(optarg, &o.telemetry_interval_s)) {
          return Usage("--telemetry-interval '" + v + "' must be a number of seconds in (0, " +
                       std::to_string(static_cast<int>(kMaxTelemetryIntervalS)) + "]");
        }
        break;
      case kShmCapacity: {
        unsigned long long cap = 0;
        // Bounded by the payload limit, not the largest mapping a reader accepts: the
        // writer refuses any payload above kMaxPayloadBytes, so more capacity is never used.
        if (!ParseUnsigned(optarg, heroserve::shm::kMaxPayloadBytes, &cap) ||
            cap < kMinShmCapacity) {
          return Usage("--shm-capacity '" + v + "' must be a whole number of bytes from " +
                       std::to_string(kMinShmCapacity) + " to " +
                       std::to_string(heroserve::shm::kMaxPayloadBytes));
        }
        o.shm_capacity = static_cast<size_t>(cap);
        break;
      }
      case kInaConfig:
        if (v.empty()) return Usage("--ina-config needs a file path");
        o.ina.path = v;
        break;
      case kInaSwitch: {
        auto eq = v.find('=');
        agent::InaEndpoint ep;
        if (eq == 0 || eq == std::string::npos ||
            !agent::ParseInaEndpoint(v.substr(eq + 1), kInaPort, &ep)) {
          return Usage("--ina-switch '" + v + "' must be NAME=IPV4 or NAME=IPV4:PORT");
        }
        o.ina.switches[v.substr(0, eq)] = ep;
        break;
      }
      case kInaBind:
        if (!agent::ParseInaEndpoint(v, kInaPort, &o.ina.bind)) {
          return Usage("--ina-bind '" + v + "' must be IPV4 or IPV4:PORT");
        }
        break;
      case kLogFormat:
        if (!hlog::ParseFormat(v, &format)) {
          return Usage("--log-format '" + v + "' must be text or json");
        }
        break;
      case kLogLevel:
        if (!hlog::ParseLevel(v, &level)) {
          return Usage("--log-level '" + v + "' must be DEBUG, INFO, WARNING or ERROR");
        }
        break;
      case ':':
        return Usage(Spelled(argv, optind) + " needs a value");
      default:  // '?': unknown, ambiguous, or a value given to a flag
        if (optopt == kInsecure || optopt == kVersion ||
            (optopt == 'h' && Spelled(argv, optind) == "--help")) {
          return Usage(Spelled(argv, optind) + " takes no value");
        }
        if (optopt != 0 && optopt < kController) {
          return Usage(std::string("unknown option -") + static_cast<char>(optopt));
        }
        return Usage("unknown or ambiguous option " + Spelled(argv, optind));
    }
  }
  if (optind < argc) return Usage(std::string("unexpected argument '") + argv[optind] + "'");
  const struct {
    std::string* value;
    const char* flag;
    const char* var;
  } env[] = {{&o.controller, "--controller", "HEROSERVE_CONTROLLER"},
             {&o.tls_ca, "--tls-ca", "HEROSERVE_TLS_CA"},
             {&o.tls_cert, "--tls-cert", "HEROSERVE_TLS_CERT"},
             {&o.tls_key, "--tls-key", "HEROSERVE_TLS_KEY"}};
  std::string controller_name;
  for (const auto& e : env) {
    bool bad = false;
    std::string name = FromEnv(e.value, e.flag, e.var, &bad);
    if (bad) return Usage(std::string(e.var) + ": control characters in the value");
    if (e.value == &o.controller) controller_name = name;
  }
  if (o.controller.empty()) {
    return Usage("--controller HOST:PORT is required (or HEROSERVE_CONTROLLER)");
  }
  if (o.node_id.empty()) return Usage("--node-id NODE is required");
  agent::HostPort hp;
  std::string why;
  if (!agent::ParseHostPort(o.controller, &hp, &why)) return Usage(controller_name + " " + why);
  int tls = !o.tls_ca.empty() + !o.tls_cert.empty() + !o.tls_key.empty();
  if (tls != 0 && tls != 3) {
    return Usage("give all of --tls-ca, --tls-cert and --tls-key (or HEROSERVE_TLS_CA, _CERT, "
                 "_KEY), or none");
  }
  if (tls == 0 && !agent::IsLoopbackHost(hp.host) && !o.insecure) {
    return Usage("refusing to talk to " + o.controller +
                 " without TLS (only 127.0.0.0/8, ::1 and localhost are loopback): give "
                 "--tls-ca/--tls-cert/--tls-key, or --insecure");
  }
  hlog::Configure(level, format);

  // Signals go to a dedicated thread (sigwait), which stops the daemon cleanly.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  agent::Daemon daemon(o);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    agent::Log("INFO", std::string("signal ") + std::to_string(sig) + ", stopping");
    daemon.Stop();
  });
  int rc = daemon.Run();
  // Wake the waiter if Run ended on its own.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return rc;
}
