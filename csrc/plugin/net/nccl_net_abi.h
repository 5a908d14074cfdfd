/* NCCL's network/CollNet plugin ABI, versions 8 to 12, from the vendored headers
 * (csrc/third_party/nccl/README.md). The headers need ncclDataType_t and ncclRedOp_t from
 * nccl.h; we declare them here with nccl.h's values (NCCL 2.30.7 src/nccl.h.in; the enum
 * values and the 4-byte size are part of NCCL's ABI and have not changed since 2.19). */
#ifndef HEROSERVE_NCCL_NET_ABI_H_
#define HEROSERVE_NCCL_NET_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include "../../third_party/nccl/err.h"
#include "../../third_party/nccl/common.h"
#include "../../third_party/nccl/net_device.h"

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_NET_MAX_REQUESTS 32

#include "../../third_party/nccl/net/net_v12.h"
#include "../../third_party/nccl/net/net_v11.h"
#include "../../third_party/nccl/net/net_v10.h"
#include "../../third_party/nccl/net/net_v9.h"
#include "../../third_party/nccl/net/net_v8.h"

#endif
