/* The watchdog (watchdog.h): a thread that waits on a condition variable
 * (the monotonic clock) for the disarm or the deadline. */
#include "core/watchdog.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct td__watchdog {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int disarmed;
    int ms;
    struct timespec deadline;
    char what[256];
};

static void *watch(void *arg) {
    td__watchdog *w = arg;
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    while (!w->disarmed && rc == 0)
        rc = pthread_cond_timedwait(&w->cv, &w->mu, &w->deadline);
    if (!w->disarmed) {
        /* stderr is unbuffered: the line is out before the process ends */
        fprintf(stderr,
                "tandem: %s did not finish within %d ms: another process stalled or "
                "its node is unreachable; ending this process\n",
                w->what, w->ms);
        _exit(1);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

td__watchdog *td__watchdog_arm(int ms, const char *what, ...) {
    td__watchdog *w = calloc(1, sizeof *w);
    pthread_condattr_t attr;
    va_list ap;
    if (!w)
        return NULL;
    va_start(ap, what);
    vsnprintf(w->what, sizeof w->what, what, ap);
    va_end(ap);
    w->ms = ms;
    clock_gettime(CLOCK_MONOTONIC, &w->deadline);
    w->deadline.tv_sec += ms / 1000;
    w->deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (w->deadline.tv_nsec >= 1000000000L) {
        w->deadline.tv_sec++;
        w->deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&w->thread, NULL, watch, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    return w;
}

void td__watchdog_disarm(td__watchdog *w) {
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->disarmed = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
