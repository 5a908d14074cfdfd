#include "address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace heroserve::agent {

namespace {

bool Fail(std::string* error, const std::string& msg) {
  if (error) *error = msg;
  return false;
}

}  // namespace

bool ParseHostPort(const std::string& address, HostPort* out, std::string* error) {
  std::string host, port;
  if (!address.empty() && address[0] == '[') {
    auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return Fail(error, "'" + address + "' is not [IPV6]:PORT");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
    struct in6_addr a6 {};
    if (inet_pton(AF_INET6, host.c_str(), &a6) != 1) {
      return Fail(error, "'" + host + "' in brackets is not an IPv6 address");
    }
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos) return Fail(error, "'" + address + "' has no :PORT");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return Fail(error, "'" + address + "': write an IPv6 address as [ADDRESS]:PORT");
    }
  }
  if (host.empty()) return Fail(error, "'" + address + "' has no host");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) {
    return Fail(error, "'" + address + "': the port must be a number from 1 to 65535");
  }
  unsigned long p = std::stoul(port);
  if (p < 1 || p > 65535) {
    return Fail(error, "'" + address + "': the port must be a number from 1 to 65535");
  }
  out->host = host;
  out->port = static_cast<uint16_t>(p);
  return true;
}

bool IsLoopbackHost(const std::string& host) {
  if (host.size() == 9 && strncasecmp(host.c_str(), "localhost", 9) == 0) return true;
  struct in_addr a4 {};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) {
    return (ntohl(a4.s_addr) >> 24) == 127;
  }
  struct in6_addr a6 {};
  if (inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace heroserve::agent
