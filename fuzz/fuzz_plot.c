/* Fuzzes tandem plot's readers: the input is the file given to
 * `tandem plot FILE -o OUT.svg`, a metrics file (JSON lines) or a trace
 * (trace-event JSON), whichever it reads as. Any bytes must give exit 0 and
 * a whole SVG document, or exit 1 and no SVG; never a crash, a leak, or
 * undefined behaviour. Its messages go to /dev/null while it runs. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static char in[64], out[64];

/* The files go when the fuzzer exits. */
static void remove_files(void) {
    unlink(in);
    unlink(out);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *argv[5];
    int rc, saved, quiet;
    FILE *f;
    if (!in[0]) {
        snprintf(in, sizeof in, "/tmp/fuzz_plot.%ld.json", (long)getpid());
        snprintf(out, sizeof out, "/tmp/fuzz_plot.%ld.svg", (long)getpid());
        atexit(remove_files);
    }
    if (!(f = fopen(in, "wb")))
        return 0;
    if (size && fwrite(data, 1, size, f) != size) {
        fclose(f);
        return 0;
    }
    if (fclose(f) != 0)
        return 0;
    unlink(out);
    argv[0] = "plot";
    argv[1] = in;
    argv[2] = "-o";
    argv[3] = out;
    argv[4] = NULL;
    fflush(stderr);
    saved = dup(2);
    quiet = open("/dev/null", O_WRONLY);
    dup2(quiet, 2);
    rc = td_cli_plot(4, argv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(quiet);
    if (rc == 0) {
        /* a whole document */
        char tail[8] = "";
        long n;
        if (!(f = fopen(out, "rb")) || fseek(f, -7, SEEK_END) != 0 || (n = ftell(f)) < 0 ||
            fread(tail, 1, 7, f) != 7 || strcmp(tail, "</svg>\n"))
            abort();
        fclose(f);
    } else if (rc != 1 || access(out, F_OK) == 0) {
        abort();
    }
    return 0;
}
