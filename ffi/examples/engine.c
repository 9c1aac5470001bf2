/* A minimal C "engine": registers, beats from a thread, and registers again
 * when told it was evicted or when the reaper's boot token changes (the
 * server restarted). Usage: engine TABLE INSTANCE_ID SECONDS */
#include <livereg.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static livereg_table *table;
static livereg_worker *worker;
static uint64_t instance_id;
static volatile int running = 1;

static void register_or_die(const char *why) {
    livereg_result r;
    while ((r = livereg_register(table, instance_id, "c-engine", &worker)) != LIVEREG_OK) {
        if (r != LIVEREG_EXISTS && r != LIVEREG_TIMEOUT) {
            fprintf(stderr, "register: %s: %s\n", livereg_result_str(r), livereg_last_error());
            exit(1);
        }
        usleep(50 * 1000);
    }
    printf("registered (%s)\n", why);
    fflush(stdout);
}

static void *beat(void *unused) {
    uint64_t known = 0, token = 0;
    (void)unused;
    if (livereg_probe(table, &token) == LIVEREG_OK) {
        known = token;
    }
    while (running) {
        if (livereg_ping(worker) == LIVEREG_EVICTED) {
            livereg_deregister(worker); /* frees the handle; returns EVICTED */
            register_or_die("after eviction");
        }
        if (livereg_probe(table, &token) == LIVEREG_OK && token != known) {
            if (known != 0) {
                livereg_deregister(worker);
                register_or_die("reaper restarted");
            }
            known = token;
        }
        usleep(50 * 1000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t thread;
    livereg_result r;
    if (argc != 4) {
        fprintf(stderr, "usage: %s TABLE INSTANCE_ID SECONDS\n", argv[0]);
        return 2;
    }
    instance_id = strtoull(argv[2], NULL, 10);
    if ((r = livereg_open(argv[1], &table)) != LIVEREG_OK) {
        fprintf(stderr, "open: %s: %s\n", livereg_result_str(r), livereg_last_error());
        return 1;
    }
    register_or_die("start");
    pthread_create(&thread, NULL, beat, NULL);
    sleep((unsigned)atoi(argv[3]));
    running = 0;
    pthread_join(thread, NULL);
    livereg_deregister(worker);
    livereg_close(table);
    printf("stopped\n");
    return 0;
}
