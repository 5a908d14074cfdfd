/* C API of the HeroServe policy core (docs/design.md §11), for the Python binding
 * (agents/gpu/policy_core.py) and the Mininet hosts. All functions are thread-compatible:
 * one hs_scheduler per thread; hs_store_* may be shared (one writer, many readers).
 * Errors: functions returning int give -1 and write a message into err (when not NULL). */
#ifndef HEROSERVE_HEROSERVE_H_
#define HEROSERVE_HEROSERVE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_scheduler hs_scheduler;
typedef struct hs_store hs_store;

const char* hs_version(void);

/* A table store (lock-free reads). */
hs_store* hs_store_new(void);
void hs_store_free(hs_store* s);
/* 1 published, 0 stale (version not above the newest), -1 invalid table. */
int hs_store_publish_json(hs_store* s, const char* table_json, char* err, size_t errlen);

/* A scheduler, optionally fed by a store (NULL: tables come only from install). */
hs_scheduler* hs_scheduler_new(hs_store* store);
void hs_scheduler_free(hs_scheduler* s);
/* 1 accepted, 0 stale, -1 invalid table. Takes effect at its apply_from_seq. */
int hs_scheduler_install_json(hs_scheduler* s, const char* table_json, char* err, size_t errlen);
/* Eqs. 16-17 for nbytes (>= 0). 0 ok (policy id and J(c*, D) written), -1 no table in force
 * or bad size. */
int hs_scheduler_select(hs_scheduler* s, double nbytes, uint32_t* policy_id, double* cost);
/* Window boundary: JSON object link id -> utilisation in [0, 1]. 0 ok, -1 error. */
int hs_scheduler_observe_json(hs_scheduler* s, const char* util_json, char* err, size_t errlen);
uint64_t hs_scheduler_seq(const hs_scheduler* s);
/* Version in force, 0 when none. */
uint64_t hs_scheduler_version(const hs_scheduler* s);
/* Number of policies in force; copies up to cap costs b_c (policy order) into out. */
size_t hs_scheduler_costs(const hs_scheduler* s, double* out, size_t cap);

/* Publish a table list ({"tables": [...]}, or one table) into the group's shm segment, as the
 * daemon does (for tests and emulation). 0 ok, -1 error. */
int hs_shm_publish_json(const char* group_id, const char* tables_json, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* HEROSERVE_HEROSERVE_H_ */
