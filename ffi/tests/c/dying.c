/*
 * Death as it begins, as a C server sees it through livereg.h alone: a
 * worker process (forked, in this PID namespace or a new one) holds MIB of
 * touched 4 KiB pages and registers; the server SIGKILLs it and records, on
 * CLOCK_MONOTONIC, when its on_dying and its on_drop ran and when the
 * kernel's pidfd said the process had ended.
 *
 *   dying TABLE MIB RUNS [pidns]
 *
 * Prints one line per run, "run N dying_us D drop_us P pidfd_us F", then
 * "median dying_us D drop_us P pidfd_us F". Exits 1 when an order or a
 * reason is wrong (on_dying after on_drop, a reason other than
 * PROCESS_EXITED, a callback missing).
 */
#define _GNU_SOURCE
#include <livereg.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct seen {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    uint64_t dying_ns, drop_ns;
    int dying_reason, drop_reason;
};

static void on_dying(void *userdata, const livereg_drop_event *event) {
    struct seen *seen = userdata;
    uint64_t at = now_ns();
    pthread_mutex_lock(&seen->lock);
    if (!seen->dying_ns) {
        seen->dying_ns = at;
        seen->dying_reason = (int)event->reason;
    }
    pthread_cond_broadcast(&seen->changed);
    pthread_mutex_unlock(&seen->lock);
}

static void on_drop(void *userdata, const livereg_drop_event *event) {
    struct seen *seen = userdata;
    uint64_t at = now_ns();
    pthread_mutex_lock(&seen->lock);
    if (!seen->drop_ns) {
        seen->drop_ns = at;
        seen->drop_reason = (int)event->reason;
    }
    pthread_cond_broadcast(&seen->changed);
    pthread_mutex_unlock(&seen->lock);
}

/* The worker: hold the memory, register, say so, beat until killed. */
static void worker(const char *name, size_t mib, int ready) {
    size_t bytes = mib << 20;
    char *held = NULL;
    if (bytes) {
        held = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (held == MAP_FAILED) _exit(2);
        madvise(held, bytes, MADV_NOHUGEPAGE);
        for (size_t at = 0; at < bytes; at += 4096) held[at] = 1;
    }
    livereg_table *table = NULL;
    livereg_worker *me = NULL;
    if (livereg_open(name, &table) != LIVEREG_OK) _exit(3);
    if (livereg_register(table, 1, "dying-c", &me) != LIVEREG_OK) _exit(4);
    /* The death thread claims the process's word just after the first
     * registration (it does not hold the registration up): let it run. */
    usleep(200000);
    if (write(ready, "r", 1) != 1) _exit(5);
    for (;;) {
        livereg_ping(me);
        usleep(20000);
    }
}

/* Forks the worker, in a new PID namespace (as its pid 1) with `pidns`.
 * Returns the pid to kill, in this namespace. */
static pid_t start_worker(const char *name, size_t mib, int pidns, int ready) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (!pidns) worker(name, mib, ready);
    if (unshare(CLONE_NEWPID) != 0) _exit(6);
    pid_t init = fork();
    if (init == 0) worker(name, mib, ready);
    /* Dies with its init (the worker), as a container's runtime would. */
    int status;
    waitpid(init, &status, 0);
    _exit(0);
}

/* The process to kill in a namespace run: the intermediate parent's only
 * child, the worker. */
static pid_t victim(pid_t started, int pidns) {
    if (!pidns) return started;
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", started, started);
    FILE *file = fopen(path, "r");
    if (!file) return started;
    pid_t child = 0;
    if (fgets(line, sizeof line, file)) child = (pid_t)atoi(line);
    fclose(file);
    return child ? child : started;
}

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: dying TABLE MIB RUNS [pidns]\n");
        return 2;
    }
    const char *name = argv[1];
    size_t mib = (size_t)strtoull(argv[2], NULL, 10);
    int runs = atoi(argv[3]);
    int pidns = argc > 4 && strcmp(argv[4], "pidns") == 0;
    livereg_options options;
    livereg_options_default(&options);
    options.capacity = 8;
    options.reap_timeout_ms = 30000;
    options.registration_grace_ms = 30000;
    livereg_table *table = NULL;
    livereg_unlink(name);
    if (livereg_create(name, &options, &table) != LIVEREG_OK) {
        fprintf(stderr, "create: %s\n", livereg_last_error());
        return 2;
    }
    uint64_t *dying = calloc((size_t)runs, sizeof *dying);
    uint64_t *dropped = calloc((size_t)runs, sizeof *dropped);
    uint64_t *ended = calloc((size_t)runs, sizeof *ended);
    int failed = 0;
    for (int run = 0; run < runs && !failed; run++) {
        struct seen seen = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
        livereg_callbacks callbacks = {0};
        callbacks.userdata = &seen;
        callbacks.on_dying = on_dying;
        callbacks.on_drop = on_drop;
        livereg_reaper *reaper = NULL;
        if (livereg_reaper_start(table, &callbacks, &reaper) != LIVEREG_OK) {
            fprintf(stderr, "reaper: %s\n", livereg_last_error());
            return 2;
        }
        int pipe_fds[2];
        if (pipe(pipe_fds) != 0) return 2;
        pid_t started = start_worker(name, mib, pidns, pipe_fds[1]);
        char byte;
        if (read(pipe_fds[0], &byte, 1) != 1) {
            fprintf(stderr, "the worker never registered\n");
            return 2;
        }
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        pid_t target = victim(started, pidns);
        int pidfd = (int)syscall(SYS_pidfd_open, target, 0);
        usleep(100000); /* the reaper has seen it registered */
        uint64_t killed = now_ns();
        kill(target, SIGKILL);
        struct pollfd poll_fd = {pidfd, POLLIN, 0};
        if (pidfd >= 0 && poll(&poll_fd, 1, 60000) == 1) ended[run] = now_ns() - killed;
        pthread_mutex_lock(&seen.lock);
        while (!seen.drop_ns) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 60;
            if (pthread_cond_timedwait(&seen.changed, &seen.lock, &until) == ETIMEDOUT) break;
        }
        pthread_mutex_unlock(&seen.lock);
        if (!seen.dying_ns || !seen.drop_ns) {
            fprintf(stderr, "run %d: on_dying %s, on_drop %s\n", run, seen.dying_ns ? "ran" : "missing",
                    seen.drop_ns ? "ran" : "missing");
            failed = 1;
        } else if (seen.dying_ns > seen.drop_ns) {
            fprintf(stderr, "run %d: on_dying ran after on_drop\n", run);
            failed = 1;
        } else if (seen.dying_reason != LIVEREG_REASON_PROCESS_EXITED ||
                   seen.drop_reason != LIVEREG_REASON_PROCESS_EXITED) {
            fprintf(stderr, "run %d: reasons %d, %d, expected %d\n", run, seen.dying_reason,
                    seen.drop_reason, (int)LIVEREG_REASON_PROCESS_EXITED);
            failed = 1;
        }
        dying[run] = seen.dying_ns - killed;
        dropped[run] = seen.drop_ns - killed;
        printf("run %d dying_us %.1f drop_us %.1f pidfd_us %.1f\n", run, dying[run] / 1e3,
               dropped[run] / 1e3, ended[run] / 1e3);
        fflush(stdout);
        int status;
        waitpid(started, &status, 0);
        if (pidfd >= 0) close(pidfd);
        livereg_reaper_stop(reaper);
    }
    livereg_close(table);
    livereg_unlink(name);
    if (failed) return 1;
    qsort(dying, (size_t)runs, sizeof *dying, compare);
    qsort(dropped, (size_t)runs, sizeof *dropped, compare);
    qsort(ended, (size_t)runs, sizeof *ended, compare);
    printf("median dying_us %.1f drop_us %.1f pidfd_us %.1f\n", dying[runs / 2] / 1e3,
           dropped[runs / 2] / 1e3, ended[runs / 2] / 1e3);
    return 0;
}
