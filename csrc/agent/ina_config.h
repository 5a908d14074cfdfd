// The CollNet plugin's INA group configuration, written by the GPU agent (csrc/README.md,
// "INA group configuration"; docs/design.md §8): the controller's InaAssignment of every
// aggregation group one of this server's GPUs is a member of becomes one entry per (group,
// member GPU) of the file HEROSERVE_INA_CONFIG names (csrc/ina/group_config.h's format):
// the group id, this GPU's worker id and the worker count (the member order the controller
// fixed), the window (its aggregator slots), the switch's address, the session and first
// generation, the lane format, the local address to bind.
//
// The switch's address is this host's fact, not the controller's: the address its INA
// traffic is sent to, routed through that switch (--ina-switch NAME=IPV4[:PORT]); the
// topology and the switch's registration name no addresses. An assignment whose switch has
// none is left out and named in the acknowledgement.
//
// Every entry is checked with the plugin's own parser (ParseGroupConfig) before it is
// written, so the file holds only what the plugin accepts; the document is bounded
// (kMaxConfigBytes) and replaced atomically (a temporary file in the same directory,
// fsync, rename): an engine creating a communicator reads the old or the new file whole.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace heroserve::v1 {
class GpuPolicy;
class InaAssignment;
}  // namespace heroserve::v1

namespace heroserve::agent {

struct InaEndpoint {
  in_addr_t ip = 0;  // network order
  uint16_t port = 0;
};

// "IPV4" or "IPV4:PORT" (port 1..65535; default `default_port`). false when malformed.
bool ParseInaEndpoint(const std::string& text, uint16_t default_port, InaEndpoint* out);

struct InaConfigOptions {
  std::string path;                            // "" : INA assignments are not written
  std::map<std::string, InaEndpoint> switches;  // switch name -> where its INA traffic goes
  InaEndpoint bind;                            // local address (0.0.0.0:48879 by default)
};

class InaConfigWriter {
 public:
  InaConfigWriter(InaConfigOptions opts, std::vector<std::string> gpu_ids);
  ~InaConfigWriter();

  // Applies the INA part of an update (full: the complete set, else a delta) and rewrites
  // the file when anything changed, or on the first update. Problems (an entry the parser
  // refuses, a switch with no address, the file not written) are appended to *errors; the
  // other entries are still written.
  void Apply(const heroserve::v1::GpuPolicy& gp, bool full, std::vector<std::string>* errors);

  // The document for the held assignments (exposed for tests); problems to *errors.
  std::string Document(std::vector<std::string>* errors) const;

 private:
  InaConfigOptions opts_;
  std::vector<std::string> gpu_ids_;
  // By INA group id (destroyed in the .cc, where the message type is complete).
  std::map<uint32_t, std::unique_ptr<heroserve::v1::InaAssignment>> held_;
  bool written_ = false;
};

// Writes `text` to `path` atomically (temporary file beside it, fsync, rename).
bool WriteFileAtomically(const std::string& path, const std::string& text, std::string* err);

}  // namespace heroserve::agent
