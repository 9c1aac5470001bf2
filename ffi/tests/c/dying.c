/*
 * Death as it begins, as a C server sees it through livereg.h alone: a
 * worker process (forked, in this PID namespace or a new one) holds MIB of
 * touched 4 KiB pages and registers; the server SIGKILLs it and records, on
 * CLOCK_MONOTONIC, when its on_dying and its on_drop ran and when the
 * kernel's pidfd said the process had ended.
 *
 *   dying TABLE MIB RUNS [own|pidns|session|session-fork]
 *
 * With `session`, the worker is in a container of its own (new PID, mount
 * and IPC namespaces, a private tmpfs on /dev/shm) and registers through
 * the server's `unix:` listener (livereg_connect); with `session-fork`, it
 * also forks a child that exits at once before it says it is registered.
 *
 * Prints one line per run, "run N dying_us D drop_us P pidfd_us F", then
 * "median dying_us D drop_us P pidfd_us F". Exits 1 when an order or a
 * reason is wrong (on_dying before the kill or after on_drop, a reason
 * other than PROCESS_EXITED, or DISCONNECTED for a session's drop, a
 * callback missing).
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
#include <sys/mount.h>
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

/* How the worker registers. */
enum mode { OWN, PIDNS, SESSION, SESSION_FORK };

/* The listener's address, for the session modes. */
static char address[128];

/* The worker: hold the memory, register, say so, beat until killed. */
static void worker(const char *name, size_t mib, enum mode mode, int ready) {
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
    if (mode >= SESSION) {
        if (livereg_connect(address, NULL, 1, "dying-c", &me) != LIVEREG_OK) _exit(3);
    } else {
        if (livereg_open(name, &table) != LIVEREG_OK) _exit(3);
        if (livereg_register(table, 1, "dying-c", &me) != LIVEREG_OK) _exit(4);
    }
    /* The death thread claims the process's word just after the first
     * registration (it does not hold the registration up): let it run. */
    usleep(200000);
    if (mode == SESSION_FORK) {
        /* A child that exits at once, its parent's word claimed: never its
         * parent's death (the server checks no on_dying came before its
         * kill). */
        pid_t child = fork();
        if (child == 0) _exit(0);
        int status;
        if (child < 0 || waitpid(child, &status, 0) != child) _exit(7);
        usleep(200000);
    }
    if (write(ready, "r", 1) != 1) _exit(5);
    for (;;) {
        livereg_ping(me);
        usleep(20000);
    }
}

/* Forks the worker, in a new PID namespace (as its pid 1) unless `own`,
 * in a container of its own (new mount and IPC namespaces too, a private
 * /dev/shm) for a session. Returns the pid to kill, in this namespace. */
static pid_t start_worker(const char *name, size_t mib, enum mode mode, int ready) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (mode == OWN) worker(name, mib, mode, ready);
    int flags = CLONE_NEWPID | (mode >= SESSION ? CLONE_NEWNS | CLONE_NEWIPC : 0);
    if (unshare(flags) != 0) _exit(6);
    if (mode >= SESSION && (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
                            mount("contained", "/dev/shm", "tmpfs", 0, NULL) != 0))
        _exit(8);
    pid_t init = fork();
    if (init == 0) worker(name, mib, mode, ready);
    /* Dies with its init (the worker), as a container's runtime would. */
    int status;
    waitpid(init, &status, 0);
    _exit(0);
}

/* The process to kill in a namespace run: the intermediate parent's only
 * child, the worker. */
static pid_t victim(pid_t started, enum mode mode) {
    if (mode == OWN) return started;
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
        fprintf(stderr, "usage: dying TABLE MIB RUNS [own|pidns|session|session-fork]\n");
        return 2;
    }
    const char *name = argv[1];
    size_t mib = (size_t)strtoull(argv[2], NULL, 10);
    int runs = atoi(argv[3]);
    const char *named = argc > 4 ? argv[4] : "own";
    enum mode mode = strcmp(named, "pidns") == 0          ? PIDNS
                     : strcmp(named, "session") == 0      ? SESSION
                     : strcmp(named, "session-fork") == 0 ? SESSION_FORK
                                                          : OWN;
    snprintf(address, sizeof address, "unix:/tmp/%s.sock", name);
    /* A session is dropped at its socket's close, a table's registration at
     * its process's end. */
    int drop_reason = mode >= SESSION ? LIVEREG_REASON_DISCONNECTED : LIVEREG_REASON_PROCESS_EXITED;
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
        if (mode >= SESSION && livereg_reaper_listen(reaper, address, NULL) != LIVEREG_OK) {
            fprintf(stderr, "listen: %s\n", livereg_last_error());
            return 2;
        }
        int pipe_fds[2];
        if (pipe(pipe_fds) != 0) return 2;
        pid_t started = start_worker(name, mib, mode, pipe_fds[1]);
        char byte;
        if (read(pipe_fds[0], &byte, 1) != 1) {
            fprintf(stderr, "the worker never registered\n");
            return 2;
        }
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        pid_t target = victim(started, mode);
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
        } else if (seen.dying_ns < killed) {
            fprintf(stderr, "run %d: on_dying ran before the kill\n", run);
            failed = 1;
        } else if (seen.dying_ns > seen.drop_ns) {
            fprintf(stderr, "run %d: on_dying ran after on_drop\n", run);
            failed = 1;
        } else if (seen.dying_reason != LIVEREG_REASON_PROCESS_EXITED ||
                   seen.drop_reason != drop_reason) {
            fprintf(stderr, "run %d: reasons %d, %d, expected %d, %d\n", run, seen.dying_reason,
                    seen.drop_reason, (int)LIVEREG_REASON_PROCESS_EXITED, drop_reason);
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
