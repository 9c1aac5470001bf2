/*
 * The server's death, as a C engine sees it through livereg.h alone: a
 * reaper process (forked, holding MIB of touched 4 KiB pages, so that the
 * kernel takes a while to end it) serves the table; the engine has WAITERS
 * threads blocked in livereg_reaper_wait and one more waiting process;
 * the reaper is SIGKILLed, and each waiter records, on CLOCK_MONOTONIC, when
 * it learnt it (DYING, or ABSENT). Then a new reaper starts, and the
 * engine must see it SERVING with a new boot token.
 *
 *   server_state TABLE MIB RUNS
 *
 * Prints one line per run, "run N learnt_us FIRST LAST state S new_token
 * T", then "median learnt_us FIRST LAST" and "max learnt_us LAST" (LAST:
 * the slowest waiter of the run, threads and the other process). Exits 1
 * when a waiter saw something else, a token did not change, or a state
 * was not reached.
 */
#define _GNU_SOURCE
#include <livereg.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAITERS 4

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void fail(const char *what) {
    fprintf(stderr, "server_state: %s: %s\n", what, livereg_last_error());
    exit(1);
}

/* The reaper process: hold the memory, serve the table, say so, wait to
 * be killed. */
static void reaper(const char *name, size_t mib, int ready) {
    size_t bytes = mib << 20;
    if (bytes) {
        char *held = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (held == MAP_FAILED) _exit(2);
        madvise(held, bytes, MADV_NOHUGEPAGE);
        for (size_t at = 0; at < bytes; at += 4096) held[at] = 1;
    }
    livereg_table *table = NULL;
    livereg_reaper *serving = NULL;
    if (livereg_open(name, &table) != LIVEREG_OK) _exit(3);
    if (livereg_reaper_start(table, NULL, &serving) != LIVEREG_OK) _exit(4);
    if (write(ready, "r", 1) != 1) _exit(5);
    for (;;) pause();
}

static pid_t start_reaper(const char *name, size_t mib) {
    int ready[2];
    if (pipe(ready) != 0) fail("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        reaper(name, mib, ready[1]);
    }
    close(ready[1]);
    char byte;
    if (read(ready[0], &byte, 1) != 1) fail("the reaper process did not start");
    close(ready[0]);
    return pid;
}

struct waiter {
    const livereg_table *table;
    uint64_t token;
    uint64_t learnt_ns;
    uint32_t state;
    livereg_result result;
};

/* Blocks until the serving reaper of `token` is no longer serving. */
static void *wait_for_change(void *arg) {
    struct waiter *waiter = arg;
    uint64_t token = 0;
    uint32_t pid = 0;
    waiter->result = livereg_reaper_wait(waiter->table, LIVEREG_REAPER_SERVING, waiter->token,
                                         20000, &waiter->state, &token, &pid);
    waiter->learnt_ns = now_ns();
    return NULL;
}

/* Another engine process: waits, then writes when it learnt (ns) and the
 * state to `out`. */
static pid_t start_waiting_process(const char *name, uint64_t token, int ready, int out) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    livereg_table *table = NULL;
    if (livereg_open(name, &table) != LIVEREG_OK) _exit(3);
    struct waiter waiter = {table, token, 0, 0, LIVEREG_OK};
    if (write(ready, "r", 1) != 1) _exit(5);
    wait_for_change(&waiter);
    uint64_t record[2] = {waiter.learnt_ns, waiter.result == LIVEREG_OK ? waiter.state : 99};
    if (write(out, record, sizeof record) != (ssize_t)sizeof record) _exit(6);
    _exit(0);
}

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: server_state TABLE MIB RUNS\n");
        return 2;
    }
    const char *name = argv[1];
    size_t mib = (size_t)strtoull(argv[2], NULL, 10);
    int runs = atoi(argv[3]);
    livereg_options options;
    livereg_options_default(&options);
    options.capacity = 8;
    options.reap_timeout_ms = 30000;
    options.registration_grace_ms = 30000;
    livereg_table *table = NULL;
    if (livereg_create(name, &options, &table) != LIVEREG_OK) fail("create");

    uint32_t state = 0, pid = 0;
    uint64_t token = 0;
    if (livereg_reaper_state(table, &state, &token, &pid) != LIVEREG_OK) fail("state");
    if (state != LIVEREG_REAPER_ABSENT) fail("a new table's reaper is not absent");

    uint64_t *first = calloc((size_t)runs, sizeof *first);
    uint64_t *last = calloc((size_t)runs, sizeof *last);
    pid_t serving = start_reaper(name, mib);
    for (int run = 0; run < runs; run++) {
        if (livereg_reaper_state(table, &state, &token, &pid) != LIVEREG_OK) fail("state");
        if (state != LIVEREG_REAPER_SERVING || pid != (uint32_t)serving) {
            fprintf(stderr, "run %d: state %u pid %u, expected SERVING by %d\n", run, state, pid,
                    (int)serving);
            return 1;
        }
        int ready[2], out[2];
        if (pipe(ready) != 0 || pipe(out) != 0) fail("pipe");
        pid_t other = start_waiting_process(name, token, ready[1], out[1]);
        char byte;
        if (read(ready[0], &byte, 1) != 1) fail("the waiting process did not start");
        struct waiter waiters[WAITERS];
        pthread_t threads[WAITERS];
        for (int i = 0; i < WAITERS; i++) {
            waiters[i] = (struct waiter){table, token, 0, 0, LIVEREG_OK};
            pthread_create(&threads[i], NULL, wait_for_change, &waiters[i]);
        }
        usleep(100000); /* every waiter asleep in its wait */

        uint64_t killed = now_ns();
        kill(serving, SIGKILL);
        uint64_t earliest = UINT64_MAX, latest = 0;
        uint32_t seen = 0;
        for (int i = 0; i < WAITERS; i++) {
            pthread_join(threads[i], NULL);
            if (waiters[i].result != LIVEREG_OK ||
                (waiters[i].state != LIVEREG_REAPER_DYING &&
                 waiters[i].state != LIVEREG_REAPER_ABSENT)) {
                fprintf(stderr, "run %d: waiter %d: result %d state %u\n", run, i,
                        (int)waiters[i].result, waiters[i].state);
                return 1;
            }
            uint64_t after = waiters[i].learnt_ns - killed;
            earliest = after < earliest ? after : earliest;
            latest = after > latest ? after : latest;
            seen |= 1u << waiters[i].state;
        }
        uint64_t record[2];
        if (read(out[0], record, sizeof record) != (ssize_t)sizeof record) fail("the other process");
        if (record[1] != LIVEREG_REAPER_DYING && record[1] != LIVEREG_REAPER_ABSENT) {
            fprintf(stderr, "run %d: the other process saw %llu\n", run,
                    (unsigned long long)record[1]);
            return 1;
        }
        latest = record[0] - killed > latest ? record[0] - killed : latest;
        seen |= 1u << record[1];
        waitpid(other, NULL, 0);
        waitpid(serving, NULL, 0);
        close(ready[0]), close(ready[1]), close(out[0]), close(out[1]);

        /* Gone: ABSENT; then a new reaper, SERVING with a new token. */
        uint32_t now = state;
        uint64_t now_token = token;
        while (now != LIVEREG_REAPER_ABSENT) {
            livereg_result result =
                livereg_reaper_wait(table, now, now_token, 5000, &now, &now_token, NULL);
            if (result != LIVEREG_OK) fail("the killed reaper never absent");
        }
        serving = start_reaper(name, mib);
        uint64_t new_token = 0;
        if (livereg_reaper_wait(table, LIVEREG_REAPER_ABSENT, 0, 5000, &now, &new_token, &pid) !=
                LIVEREG_OK ||
            now != LIVEREG_REAPER_SERVING || pid != (uint32_t)serving) {
            fprintf(stderr, "run %d: after the restart: state %u pid %u\n", run, now, pid);
            return 1;
        }
        if (new_token == token || new_token == 0) {
            fprintf(stderr, "run %d: the new reaper's token %llx is the old one's\n", run,
                    (unsigned long long)new_token);
            return 1;
        }
        first[run] = earliest;
        last[run] = latest;
        printf("run %d learnt_us %.1f %.1f state %s new_token %llx\n", run, earliest / 1e3,
               latest / 1e3, seen & (1u << LIVEREG_REAPER_DYING) ? "dying" : "absent",
               (unsigned long long)new_token);
    }
    kill(serving, SIGKILL);
    waitpid(serving, NULL, 0);
    /* The wait times out, with the state unchanged, when nothing changes. */
    uint32_t still = 0;
    if (livereg_reaper_state(table, &state, &token, NULL) != LIVEREG_OK) fail("state");
    if (livereg_reaper_wait(table, state, token, 20, &still, NULL, NULL) != LIVEREG_TIMEOUT ||
        still != state) {
        fprintf(stderr, "an unchanged state did not time out\n");
        return 1;
    }
    uint64_t max = 0;
    for (int run = 0; run < runs; run++) max = last[run] > max ? last[run] : max;
    qsort(first, (size_t)runs, sizeof *first, compare);
    qsort(last, (size_t)runs, sizeof *last, compare);
    printf("median learnt_us %.1f %.1f\n", first[runs / 2] / 1e3, last[runs / 2] / 1e3);
    printf("max learnt_us %.1f\n", max / 1e3);
    livereg_close(table);
    return 0;
}
