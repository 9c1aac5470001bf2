/* A minimal C server that owns the table's reaper on its own epoll loop: it
 * holds state for each GPU worker it serves, frees it in on_drop when a
 * worker dies, hangs, deregisters or is cleared, and publishes its
 * configuration in the table's info area for workers to read without RPC.
 * Usage: server TABLE SECONDS INSTANCE_ID... */
#include <livereg.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 64

/* What the server holds per worker: here a staging buffer. */
typedef struct server {
    void *state[MAX_WORKERS + 1];
} server;

static const char *reason_name(livereg_reason reason) {
    switch (reason) {
    case LIVEREG_REASON_TIMEOUT: return "timeout";
    case LIVEREG_REASON_GRACE: return "grace";
    case LIVEREG_REASON_PROCESS_EXITED: return "process_exited";
    case LIVEREG_REASON_DEREGISTERED: return "deregistered";
    case LIVEREG_REASON_CLEARED: return "cleared";
    case LIVEREG_REASON_REPLACED: return "replaced";
    default: return "other";
    }
}

/* Runs inside livereg_reaper_scan, on the loop's thread. */
static void on_drop(void *userdata, const livereg_drop_event *event) {
    server *s = (server *)userdata;
    uint64_t id = event->instance_id;
    if (id <= MAX_WORKERS && s->state[id] != NULL) {
        free(s->state[id]);
        s->state[id] = NULL;
        printf("freed %llu %s\n", (unsigned long long)id, reason_name(event->reason));
    } else {
        printf("ended %llu %s\n", (unsigned long long)id, reason_name(event->reason));
    }
    fflush(stdout);
}

static int fail(const char *what, livereg_result r) {
    fprintf(stderr, "%s: %s: %s\n", what, livereg_result_str(r), livereg_last_error());
    return 1;
}

int main(int argc, char **argv) {
    static const char info[] = "{\"chunk_size\": 256}";
    server s;
    livereg_table *table = NULL;
    livereg_reaper *reaper = NULL;
    livereg_callbacks callbacks;
    livereg_result r;
    struct epoll_event watch, ready[8];
    struct itimerspec tick;
    time_t until;
    int ep, timer, i;
    if (argc < 4) {
        fprintf(stderr, "usage: %s TABLE SECONDS INSTANCE_ID...\n", argv[0]);
        return 2;
    }
    memset(&s, 0, sizeof s);
    for (i = 3; i < argc; i++) {
        unsigned long id = strtoul(argv[i], NULL, 10);
        if (id >= 1 && id <= MAX_WORKERS) {
            s.state[id] = malloc(1 << 20);
        }
    }
    if ((r = livereg_open(argv[1], &table)) != LIVEREG_OK) {
        return fail("open", r);
    }
    if ((r = livereg_set_info(table, info, sizeof info - 1)) != LIVEREG_OK) {
        return fail("set_info", r);
    }
    memset(&callbacks, 0, sizeof callbacks);
    callbacks.userdata = &s;
    callbacks.on_drop = on_drop;
    if ((r = livereg_reaper_acquire(table, &callbacks, &reaper)) != LIVEREG_OK) {
        return fail("acquire the reaper", r);
    }

    /* The loop: the reaper's descriptor beside the server's own timer. */
    ep = epoll_create1(0);
    memset(&watch, 0, sizeof watch);
    watch.events = EPOLLIN;
    watch.data.fd = livereg_reaper_fd(reaper);
    epoll_ctl(ep, EPOLL_CTL_ADD, watch.data.fd, &watch);
    timer = timerfd_create(CLOCK_MONOTONIC, 0);
    memset(&tick, 0, sizeof tick);
    tick.it_value.tv_nsec = tick.it_interval.tv_nsec = 100 * 1000 * 1000;
    timerfd_settime(timer, 0, &tick, NULL);
    watch.data.fd = timer;
    epoll_ctl(ep, EPOLL_CTL_ADD, timer, &watch);
    printf("serving\n");
    fflush(stdout);

    until = time(NULL) + atoi(argv[2]);
    while (time(NULL) < until) {
        int n = epoll_wait(ep, ready, 8, (int)livereg_reaper_next_scan_ms(reaper));
        for (i = 0; i < n; i++) {
            if (ready[i].data.fd == timer) {
                uint64_t expirations;
                if (read(timer, &expirations, sizeof expirations) < 0) {
                    perror("timer");
                }
                /* ... the server's own periodic work ... */
            }
        }
        /* Due, or woken early (a worker died, deregistered, a clear). */
        if ((r = livereg_reaper_scan(reaper, NULL)) != LIVEREG_OK) {
            return fail("scan", r);
        }
    }
    livereg_reaper_stop(reaper);
    livereg_close(table);
    close(timer);
    close(ep);
    for (i = 0; i <= MAX_WORKERS; i++) {
        free(s.state[i]);
    }
    printf("stopped\n");
    return 0;
}
