/* tandem devices: what is here, as a table for people or JSON for programs. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

static void usage(FILE *out) {
    fprintf(out, "usage: tandem devices [--devices SPEC] [--json]\n\n"
                 "Lists every device (default) or those SPEC names, with name, backend, compute\n"
                 "units, clock, memory total and free, fp64 support, SIMD ISA (CPUs), bf16\n"
                 "products (native, emulated or none) and int8 dot products (VNNI, AVX2 or\n"
                 "none), compute capability and peers (GPUs), and NUMA node.\n\n"
                 "  --devices SPEC  devices to show, such as 'cpu*2', 'cpu:0{mem=512M}', 'cuda:*'\n"
                 "  --json          print JSON instead of a table\n"
                 "  --help          show this help\n");
}

static void print_text(const td_device_info *d) {
    printf("%s\n", d->name);
    printf("  %-16s %s\n", "backend", d->backend);
    if (*d->model)
        printf("  %-16s %s\n", "model", d->model);
    if (*d->vendor)
        printf("  %-16s %s\n", "vendor", d->vendor);
    if (*d->driver)
        printf("  %-16s %s\n", "driver", d->driver);
    printf("  %-16s %d\n", (d->caps & TD_DEVICE_CAP_HOST_CORES) ? "cores" : "compute units",
           d->compute_units);
    if (*d->cores)
        printf("  %-16s %s%s\n", "logical CPUs", d->cores,
               d->pinned ? " (pinned)" : " (not pinned)");
    if (d->clock_mhz)
        printf("  %-16s %d MHz\n", "clock", d->clock_mhz);
    char total[32], free_b[32];
    printf("  %-16s %s total, %s free%s\n", "memory",
           td_cli_format_bytes((double)d->mem_total, total),
           td_cli_format_bytes((double)d->mem_free, free_b), d->mem_budget ? " (budget)" : "");
    if (d->fp64_rate > 0)
        printf("  %-16s %s (fp64:fp32 = 1:%g)\n", "fp64", d->fp64 ? "yes" : "no",
               1.0 / d->fp64_rate);
    else
        printf("  %-16s %s\n", "fp64", d->fp64 ? "yes" : "no");
    if (*d->isa)
        printf("  %-16s %s\n", "SIMD", d->isa);
    if (*d->compact_kernels)
        printf("  %-16s %s\n", "compact weights", d->compact_kernels);
    printf("  %-16s %s\n", "bf16 products", d->bf16);
    printf("  %-16s %s\n", "int8 dot", d->int8);
    if (d->cc_major)
        printf("  %-16s %d.%d\n", "compute capab.", d->cc_major, d->cc_minor);
    if (!(d->caps & TD_DEVICE_CAP_HOST_CORES))
        printf("  %-16s %s\n", "peers", *d->peers ? d->peers : "none");
    if (d->max_work_group)
        printf("  %-16s %d\n", "max work-group", d->max_work_group);
    if (d->local_mem)
        printf("  %-16s %llu KiB\n", "local memory", (unsigned long long)(d->local_mem / 1024));
    if (d->numa_node >= 0)
        printf("  %-16s %d\n", "NUMA node", d->numa_node);
    else
        printf("  %-16s unknown\n", "NUMA node");
    if (d->slowdown > 1)
        printf("  %-16s %gx (on purpose)\n", "slowdown", d->slowdown);
}

static json_t *info_json(const td_device_info *d) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(d->name));
    json_object_set_new(o, "backend", json_string(d->backend));
    json_object_set_new(o, "model", json_string(d->model));
    json_object_set_new(o, "vendor", json_string(d->vendor));
    json_object_set_new(o, "driver", json_string(d->driver));
    json_object_set_new(o, "compute_units", json_integer(d->compute_units));
    json_object_set_new(o, "clock_mhz", json_integer(d->clock_mhz));
    json_object_set_new(o, "memory_total_bytes", json_integer((json_int_t)d->mem_total));
    json_object_set_new(o, "memory_free_bytes", json_integer((json_int_t)d->mem_free));
    json_object_set_new(o, "memory_budget_bytes",
                        d->mem_budget ? json_integer((json_int_t)d->mem_budget) : json_null());
    json_object_set_new(o, "fp64", json_boolean(d->fp64));
    json_object_set_new(o, "fp64_rate", d->fp64_rate > 0 ? json_real(d->fp64_rate) : json_null());
    json_object_set_new(o, "numa_node",
                        d->numa_node >= 0 ? json_integer(d->numa_node) : json_null());
    if (*d->compact_kernels)
        json_object_set_new(o, "compact_kernels", json_string(d->compact_kernels));
    json_object_set_new(o, "bf16", json_string(d->bf16));
    json_object_set_new(o, "int8", json_string(d->int8));
    if (d->caps & TD_DEVICE_CAP_HOST_CORES) {
        json_t *isa = json_array();
        char buf[sizeof d->isa];
        snprintf(buf, sizeof buf, "%s", d->isa);
        for (char *save = NULL, *tok = strtok_r(buf, " ", &save); tok;
             tok = strtok_r(NULL, " ", &save))
            json_array_append_new(isa, json_string(tok));
        json_object_set_new(o, "simd", isa);
        json_object_set_new(o, "logical_cpus", json_string(d->cores));
        json_object_set_new(o, "pinned", json_boolean(d->pinned));
    } else {
        json_t *peers = json_array();
        char buf[sizeof d->peers];
        snprintf(buf, sizeof buf, "%s", d->peers);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save))
            json_array_append_new(peers, json_string(tok));
        json_object_set_new(o, "peers", peers);
        json_object_set_new(o, "compute_capability",
                            d->cc_major ? json_sprintf("%d.%d", d->cc_major, d->cc_minor)
                                        : json_null());
        json_object_set_new(o, "max_work_group", json_integer(d->max_work_group));
        json_object_set_new(o, "local_memory_bytes", json_integer((json_int_t)d->local_mem));
    }
    json_object_set_new(o, "slowdown", json_real(d->slowdown));
    return o;
}

int td_cli_devices(int argc, char **argv) {
    static const struct option opts[] = {
        {"devices", required_argument, NULL, 'd'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *spec = "all";
    int as_json = 0, c, rc = 0;
    td_device_list *list = NULL;
    td_status st;
    json_t *root = NULL, *arr = NULL;

    optind = 1;
    while ((c = getopt_long(argc, argv, "d:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'd': spec = optarg; break;
        case 'j': as_json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tandem devices: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if ((st = td_devices_open(spec, &list)) != TD_OK)
        return td_cli_fail("devices", st);

    if (as_json) {
        root = json_object();
        arr = json_array();
        json_object_set_new(root, "version", json_string(TD_VERSION_STRING));
        json_object_set_new(root, "devices", arr);
    }
    for (size_t i = 0; i < td_device_list_count(list); i++) {
        td_device_info info;
        if ((st = td_device_get_info(td_device_list_get(list, i), &info)) != TD_OK) {
            rc = td_cli_fail("devices", st);
            goto done;
        }
        if (as_json)
            json_array_append_new(arr, info_json(&info));
        else
            print_text(&info);
    }
    if (as_json) {
        json_t *notes = json_array();
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", td_device_list_notes(list));
        for (char *save = NULL, *tok = strtok_r(buf, "\n", &save); tok;
             tok = strtok_r(NULL, "\n", &save))
            json_array_append_new(notes, json_string(tok));
        json_object_set_new(root, "notes", notes);
        json_dumpf(root, stdout, JSON_INDENT(2));
        printf("\n");
    } else if (*td_device_list_notes(list)) {
        printf("%s", td_device_list_notes(list));
    }
done:
    json_decref(root);
    td_device_list_destroy(list);
    return rc;
}
