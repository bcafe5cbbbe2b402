/* tandem: devices, their memory, and their host threads.
 *
 * A device is a CPU core set, a GPU or an OpenCL device, opened from a device
 * spec (see td_devices_open). Each device has one host thread of its own, and
 * only that thread touches the device: calls made from other threads are
 * handed to it and waited for. Memory on one device is separate from every
 * other, even between CPU devices; data moves by explicit copies. */
#ifndef TANDEM_DEVICE_H
#define TANDEM_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_device td_device;
typedef struct td_device_list td_device_list;
typedef struct td_buffer td_buffer;
typedef struct td_event td_event;

/* What a device can do, as flags in td_device_caps() and td_device_info.caps.
 * Layers above the device layer ask these, never the backend's name. Every
 * device of one backend has the same flags. */
typedef enum td_device_cap {
    /* Its memory is host memory this process addresses directly: collectives
     * and copies may read and write its buffers without staging (CPU devices). */
    TD_DEVICE_CAP_HOST_MEMORY = 1u << 0,
    /* It is a set of this process's logical CPUs: its compute units are
     * cores, it has a SIMD ISA and its threads can be pinned (CPU devices). */
    TD_DEVICE_CAP_HOST_CORES = 1u << 1,
    /* Something other than the cores that compute moves its bytes (copy
     * engines, a device queue), so copies and reductions can overlap
     * compute (GPUs, OpenCL devices). */
    TD_DEVICE_CAP_ASYNC_COPY = 1u << 2,
    /* Direct copies to and from other devices of its backend, without host
     * staging (where the two can reach each other). */
    TD_DEVICE_CAP_PEER_COPY = 1u << 3,
    /* Records the work its host thread queues and replays it (CUDA graphs). */
    TD_DEVICE_CAP_GRAPHS = 1u << 4,
    /* Named by platform and device, "opencl:P.D". */
    TD_DEVICE_CAP_SUB_DEVICES = 1u << 5,
    /* `auto` takes every device of its backend before falling back to the
     * CPU (GPUs that only one backend lists: CUDA). */
    TD_DEVICE_CAP_AUTO = 1u << 6,
    /* Groups of such devices alone may run collectives through NCCL. */
    TD_DEVICE_CAP_NCCL = 1u << 7,
    /* Computes products of f32 matrices from bf16-rounded inputs with f32
     * sums (td_device_set_precision), natively or emulated. */
    TD_DEVICE_CAP_BF16 = 1u << 8,
} td_device_cap;

/* What `tandem devices` shows about one device. Strings are "" and numbers 0
 * (or -1 for indexes) where the backend does not know. */
typedef struct td_device_info {
    char name[32];    /* "cpu:0", "cuda:1", "opencl:0.1" */
    char backend[16]; /* "cpu", "cuda", "opencl" */
    char model[128];  /* "AMD EPYC 9R14", "NVIDIA H200" */
    char vendor[64];
    char driver[64];   /* driver or runtime version */
    int compute_units; /* cores, SMs or compute units */
    int clock_mhz;
    uint64_t mem_total; /* bytes usable on this device (the budget if one is set) */
    uint64_t mem_free;
    uint64_t mem_budget;    /* 0: no budget */
    int fp64;               /* 1 when f64 arithmetic is supported */
    double fp64_rate;       /* f64:f32 throughput, 0 when unknown */
    char isa[160];          /* CPUs: SIMD extensions, "SSE4.2 AVX2 AVX-512F ..." */
    char cores[64];         /* CPUs: the logical CPUs owned, "0,1" */
    int pinned;             /* CPUs: 1 when the host thread is bound to its cores */
    int cc_major, cc_minor; /* CUDA compute capability */
    char peers[128];        /* GPUs: devices reachable by peer copies */
    int numa_node;          /* -1 when unknown */
    uint64_t local_mem;     /* OpenCL local or CUDA shared memory per block */
    int max_work_group;     /* OpenCL max work-group or CUDA max threads per block */
    double slowdown;        /* >1 when the device was slowed on purpose */
    unsigned caps;          /* td_device_cap flags */
    char pci_bus_id[32];    /* GPUs: "0000:3B:00.0" (NVML finds it by this); "" when unknown */
    /* The kernels its products with compact weights run (generate.h):
     * "q8_0: AVX512-VNNI vpdpbusd; bf16: AVX512-BF16 vdpbf16ps" */
    char compact_kernels[128];
    /* Its products with bf16 inputs (td_device_set_precision): "native
     * (AVX512-BF16 vdpbf16ps)", "emulated (...)", or "none" where it has no
     * bf16 path (TD_DEVICE_CAP_BF16 unset). The first word is the class. */
    char bf16[64];
    /* Its int8 dot products (the q8_0 kernels): "VNNI (AVX512-VNNI
     * vpdpbusd)", "AVX2 (AVX2 vpmaddubsw)", or "none (...)" where plain integer
     * arithmetic or nothing computes them. The first word is the class. */
    char int8[64];
} td_device_info;

/* Opens the devices a spec names. The grammar, items separated by commas:
 *
 *   cpu            one device owning every core this process may use
 *   cpu:N          the device of logical CPU N (one core)
 *   cpu*K          the cores split into K devices
 *   cuda:N, cuda:*     CUDA GPU N, every CUDA GPU
 *   opencl:P.D, opencl:*  device D of OpenCL platform P, every OpenCL device
 *   auto           every GPU when there is one, else `cpu`
 *   all            every device of every backend (for listings)
 *
 * and options in braces after an item: {cores=N, mem=512M, slowdown=3, latency=2,
 * split=2}. On failure *out is NULL and the message names the item and lists
 * the devices that exist. The caller destroys the list, which closes the
 * devices; every buffer must be freed before. */
TD_API td_status td_devices_open(const char *spec, td_device_list **out);
TD_API void td_device_list_destroy(td_device_list *list);
TD_API size_t td_device_list_count(const td_device_list *list);
/* Borrowed: valid while the list lives. NULL when i is out of range. */
TD_API td_device *td_device_list_get(const td_device_list *list, size_t i);
/* One line per backend that offered no device, such as "cuda: no CUDA device
 * (CUDA driver version is insufficient for CUDA runtime version)"; "" when
 * none. Valid while the list lives. */
TD_API const char *td_device_list_notes(const td_device_list *list);

/* "cpu:0". Valid while the device is open. */
TD_API const char *td_device_name(const td_device *dev);
/* Fills *out. Safe from any thread. */
TD_API td_status td_device_get_info(td_device *dev, td_device_info *out);
/* 1 when f64 arithmetic is supported. */
TD_API int td_device_supports_f64(const td_device *dev);
/* The device's td_device_cap flags; 0 for NULL. Safe from any thread. */
TD_API unsigned td_device_caps(const td_device *dev);

/* Sets how dev computes the products of f32 matrices: TD_PRECISION_BF16
 * rounds both inputs to bf16 and sums in f32, as cuBLAS's math modes and
 * PyTorch's autocast do, in the tensor layer's matmul (the nn layers' linear
 * maps, forward and backward) and, where the backend implements it, in its
 * kernels with products inside (CPU: convolution, attention, batched GEMMs).
 * f64 products stay f64. A device without TD_DEVICE_CAP_BF16 refuses bf16
 * with TD_ERR_UNSUPPORTED naming it and stays f32. Set it while no work of
 * the device is queued (before a strategy is built on it); it lasts until
 * set again or the device closes. */
TD_API td_status td_device_set_precision(td_device *dev, td_precision p);
/* dev's precision; TD_PRECISION_F32 for NULL. Safe from any thread. */
TD_API td_precision td_device_precision(const td_device *dev);
/* What computes dev's bf16 products ("AVX512-BF16 vdpbf16ps", or an
 * emulation), for a run's report; "" without TD_DEVICE_CAP_BF16. Valid
 * while dev is open. */
TD_API const char *td_device_bf16_path(const td_device *dev);

/* Runs fn(dev, arg) on the device's host thread and waits for it; runs it
 * directly when called from that thread. Returns what fn returned, and fn's
 * message becomes the caller's. */
typedef td_status (*td_device_fn)(td_device *dev, void *arg);
TD_API td_status td_device_run(td_device *dev, td_device_fn fn, void *arg);

/* Queues fn(dev, arg) on the device's host thread, after everything queued
 * before it (an in-order queue), and returns at once. *event, when not NULL,
 * receives an event to wait on; the caller destroys it. Fails with
 * TD_ERR_DEVICE_LOST, queueing nothing, while the host thread is out in a
 * task its group gave up waiting for (so td_device_run does too): what
 * followed that task might never run. */
TD_API td_status td_device_submit(td_device *dev, td_device_fn fn, void *arg, td_event **event);

/* 1 while the device's host thread runs a task or has tasks queued. A
 * device whose thread never comes back from a task (a hung GPU) stays busy. */
TD_API int td_device_busy(const td_device *dev);

/* Waits for the task and returns its status, carrying its message over. */
TD_API td_status td_event_wait(td_event *ev);
/* TD_OK when done, TD_IN_PROGRESS while not; never blocks. */
TD_API td_status td_event_query(td_event *ev);
TD_API void td_event_destroy(td_event *ev);
/* Waits until everything queued on the device, and its own device queue, is done. */
TD_API td_status td_device_sync(td_device *dev);

/* The device whose host thread is calling, or NULL. */
TD_API td_device *td_device_current(void);

/* The {slowdown=F} and {latency=MS} options made real, for code that times a
 * device through its own ops (tandem bench devices): called on dev's host
 * thread after a stretch of work that began at start_ns (td_clock_ns), it
 * spins (F - 1) times the stretch's length, plus MS milliseconds when
 * with_latency, so the device looks as slow as the nn layer makes its passes.
 * Does nothing when F is 1 and MS 0 (or with_latency is 0). */
TD_API void td_device_throttle(td_device *dev, uint64_t start_ns, int with_latency);

/* Memory. Allocation counts against the device's budget ({mem=...}) as well
 * as its real memory; going over either is TD_ERR_OUT_OF_MEMORY with the
 * device, the size asked and the size left in the message. */
TD_API td_status td_buffer_alloc(td_device *dev, size_t nbytes, td_buffer **out);
/* NULL-safe. Must be called before the buffer's device is closed. */
TD_API void td_buffer_free(td_buffer *buf);
TD_API size_t td_buffer_size(const td_buffer *buf);
TD_API td_device *td_buffer_device(const td_buffer *buf);
/* Host to device and device to host, synchronous. Out-of-range offsets or
 * sizes are TD_ERR_INVALID_ARG. */
TD_API td_status td_buffer_write(td_buffer *dst, size_t offset, const void *src, size_t nbytes);
TD_API td_status td_buffer_read(const td_buffer *src, size_t offset, void *dst, size_t nbytes);
/* Device to device, any two devices: direct (peer) where the backend can,
 * else staged through host memory. Synchronous. */
TD_API td_status td_buffer_copy(td_buffer *dst, size_t dst_offset, const td_buffer *src,
                                size_t src_offset, size_t nbytes);
/* Whether td_buffer_copy into a buffer on dst from one on src runs on dst's
 * host thread alone (the same device, or a peer copy). Otherwise it also
 * runs a read on src's host thread, so a caller on dst's thread must not
 * wait for it while src's thread waits for that caller. */
TD_API int td_buffer_copy_is_direct(const td_device *dst, const td_device *src);

/* Bytes in use on the device through td_buffer_alloc. */
TD_API uint64_t td_device_mem_used(const td_device *dev);

/* The cache of `tandem bench devices`: what each device measured, kept per
 * device and build in one JSON file so that a later run, and the data
 * strategy's first shares, need not measure again. The library owns its
 * place, keys, format and checks; the caller only reads and writes entries.
 *
 * Where the file is:
 *   TANDEM_BENCH_CACHE=off        no cache: nothing read or written
 *   TANDEM_BENCH_CACHE=PATH       that file
 *   TANDEM_CACHE=DIR              DIR/bench-devices.json
 *   XDG_CACHE_HOME, else HOME     .../tandem/bench-devices.json (~/.cache/tandem)
 *
 * Entries are a JSON object from key to entry. A device's key (from
 * td_bench_device_key) names the build and every property and spec option
 * that changes its speed; its entry holds "device", "build", "quick",
 * "measured_unix", "gemm_f32_gflops", "gemm_f32_n", "gemm_f64_gflops" and
 * "gemm_f64_n" (null without fp64), "gemm_bf16_gflops" and "gemm_bf16_n"
 * (null without a bf16 path; absent in caches from before, which still load),
 * "mem_bw_gbs", "h2d_gbs", "d2h_gbs" and "launch_us". A copy's key (from td_bench_peer_key) holds
 * "src", "dst", "build", "quick", "measured_unix", "bytes" and "gbs". */
/* Bytes for any key td_bench_device_key and td_bench_peer_key make. */
#define TD_BENCH_KEY_MAX      1024
#define TD_BENCH_PEER_KEY_MAX (2 * TD_BENCH_KEY_MAX + 16)

/* What reading the cache found. */
typedef enum td_bench_cache_state {
    TD_BENCH_CACHE_OFF = 0, /* switched off, or no place for it */
    TD_BENCH_CACHE_MISSING, /* no file yet */
    TD_BENCH_CACHE_OK,      /* read, every entry valid */
    TD_BENCH_CACHE_PARTLY,  /* read, some entries left out (why says which) */
    TD_BENCH_CACHE_INVALID, /* unreadable or not this format: all left out */
} td_bench_cache_state;

/* The cache file's path into out (n bytes). Returns 0 when the cache is off
 * (or no home is known, or the path does not fit), else 1. */
TD_API int td_bench_cache_path(char *out, size_t n);

/* This build, as keys and entries name it: "0.1.0 release cuda opencl
 * clblast". Static. */
TD_API const char *td_bench_build_id(void);

/* The cache key of dev into out (TD_BENCH_KEY_MAX bytes). Fails only when
 * the device's properties cannot be read. */
TD_API td_status td_bench_device_key(td_device *dev, char *out, size_t n);

/* The cache key of a copy from the device keyed src_key to the one keyed
 * dst_key, into out (TD_BENCH_PEER_KEY_MAX bytes). */
TD_API void td_bench_peer_key(const char *src_key, const char *dst_key, char *out, size_t n);

/* Reads the cache at path without trusting it: *entries_json receives the
 * valid entries as a JSON object's text ("{}" when the file is missing or
 * invalid; malloc'ed, the caller frees it). *state says what was found; why
 * (may be NULL) gets a line on what was left out and why ("" when nothing).
 * Fails only when memory runs out (*entries_json then NULL). */
TD_API td_status td_bench_cache_read(const char *path, char **entries_json,
                                     td_bench_cache_state *state, char *why, size_t why_size);

/* Writes entries_json (a JSON object from key to entry, as read above with
 * entries added or replaced) as the cache at path, atomically (a reader sees
 * the old file or the new one), making its folder when missing; keeps the
 * newest 256 entries. TD_ERR_PARSE when entries_json is not a JSON object;
 * on any failure the old file (if any) is untouched and the message names
 * the path. */
TD_API td_status td_bench_cache_write(const char *path, const char *entries_json);

#ifdef __cplusplus
}
#endif
#endif
