/* A watchdog for calls that have no timeout of their own: MPI's start-up
 * and the creation of a communicator wait for every process, so one that
 * stalled (or whose node went away) would hang the others for good. Armed
 * before such a call and disarmed after it; if the call has not returned
 * by then, the process says why on stderr and ends (status 1), as a
 * collective that times out ends a run, and mpirun ends the rest. */
#ifndef TD_CORE_WATCHDOG_H
#define TD_CORE_WATCHDOG_H

typedef struct td__watchdog td__watchdog;

/* Starts watching for ms milliseconds; what (printf-style) says what is
 * awaited. NULL when no watchdog could be started (the call then runs
 * unwatched, as before). */
td__watchdog *td__watchdog_arm(int ms, const char *what, ...) __attribute__((format(printf, 2, 3)));
/* Stops watching and frees w; NULL-safe. */
void td__watchdog_disarm(td__watchdog *w);

#endif
