// The controller address the GPU agent is given, and whether it may be spoken to without
// TLS. Only a loopback controller may: 127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z) and the
// name `localhost`. Every other host, a name such as `127.evil.example` included, is remote,
// whatever its spelling suggests: the resolver, not the string, decides where it goes.
#pragma once

#include <cstdint>
#include <string>

namespace heroserve::agent {

struct HostPort {
  std::string host;  // without brackets for IPv6
  uint16_t port = 0;
};

// "HOST:PORT" or "[IPV6]:PORT" with a port in 1..65535. False with a one-line reason.
bool ParseHostPort(const std::string& address, HostPort* out, std::string* error);

// True for an IPv4 literal in 127.0.0.0/8, the IPv6 literal ::1 (or its IPv4-mapped
// 127.0.0.0/8 form) and `localhost` (any case); false for everything else.
bool IsLoopbackHost(const std::string& host);

}  // namespace heroserve::agent
