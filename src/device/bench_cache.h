/* The cache of `tandem bench devices`: what each device measured, kept per
 * device and build so that a later run (and the data strategy's first
 * shares) need not measure again.
 *
 * One JSON file, written whole and atomically (a temporary file beside it,
 * then rename), so a reader sees the old file or the new one, never half of
 * one. Its entries are keyed by a string made of the build (version,
 * optimisation, sanitizers, backends built in) and the device's properties
 * (backend, name, model, vendor, driver, units, cores, ISA, fp64, and the
 * spec options that change its speed: slowdown, latency, split, denormals).
 * A device measured under another build or with other options is another
 * key. Nothing read is trusted: a file that is not this format, or an entry
 * whose figures are not positive finite numbers in a plausible range, is
 * left out and rewritten at the next measurement.
 *
 * Where the file is, and what an entry holds: tandem/device.h.
 * The tests set TANDEM_BENCH_CACHE=off (tests/CMakeLists.txt), so a
 * developer's cache never reaches them. */
#ifndef TD_DEVICE_BENCH_CACHE_H
#define TD_DEVICE_BENCH_CACHE_H

#include <jansson.h>
#include <stddef.h>

#include "tandem/device.h"

#define TD_BENCH_CACHE_FORMAT  "tandem-bench-devices"
#define TD_BENCH_CACHE_VERSION 1

/* The path, the build id, the keys and the state are public (tandem/device.h:
 * td_bench_cache_path, td_bench_build_id, td_bench_device_key,
 * td_bench_peer_key, td_bench_cache_state), as are reading and writing the
 * entries as JSON text (td_bench_cache_read, td_bench_cache_write), which
 * wrap the two below. */

/* Reads the cache at path: a new object of its valid entries (key to entry;
 * empty when the file is missing or invalid), never NULL unless memory runs
 * out. *state says what was found; why (may be NULL) gets a line on what was
 * left out and why ("" when nothing). The caller releases the object with
 * json_decref. */
json_t *td__bench_cache_load(const char *path, td_bench_cache_state *state, char *why,
                             size_t why_size);

/* Writes entries (key to entry) as the cache at path, atomically, making its
 * directory when missing; keeps the newest 256 entries. On failure the old
 * file (if any) is untouched and the message names the path. */
td_status td__bench_cache_save(const char *path, json_t *entries);

/* Whether an entry's figures can be trusted: every required figure a
 * positive finite number in a plausible range. Peer entries (keys made by
 * td_bench_peer_key) need only their copy rate. */
int td__bench_entry_valid(const char *key, const json_t *entry);

/* The cached f32 GEMM GFLOP/s of each of devs[0..n) into gflops[], for the
 * data strategy's first shares. Returns 1 when every device has a figure
 * from this build, else 0 (gflops[] then unspecified); 0 when the cache is
 * off. Reads the file each call; never fails otherwise. */
int td__bench_cache_gflops(td_device *const *devs, int n, double *gflops);

#endif
