/*
 * A program of an earlier release, built against that release's livereg.h
 * (before-dying/livereg.h: the release before on_dying, three-word
 * livereg_callbacks; with-dying/livereg.h: the last header before sizes
 * travelled, four words, compiled with -DHEADER_HAS_ON_DYING), run against
 * today's library. It calls the plain entry points, as such a program does.
 *
 * Every struct it hands the library ends where a page ends, and the next
 * page is unmapped: a library that reads or writes one byte past the
 * struct this program's header declared kills the program (SIGSEGV).
 *
 *   old_header TABLE_NAME EXPECT_DYING(0|1)
 *
 * A reaper thread (livereg_reaper_start) must see a SIGKILLed worker
 * reach on_drop (reason PROCESS_EXITED); with EXPECT_DYING 1, on_dying
 * before it (the program prints "registered" and waits for a line on stdin
 * before the kill: the worker's death word is claimed then), else never. A driven reaper (livereg_reaper_acquire) must see
 * a deregistration reach on_drop. Prints "old header: all checks passed".
 */
#define _GNU_SOURCE
#include <livereg.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXPECT(call, want)                                                              \
    do {                                                                                \
        livereg_result got_ = (call);                                                   \
        if (got_ != (want)) {                                                           \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s: %s\n", __FILE__,        \
                    __LINE__, #call, livereg_result_str(got_), livereg_result_str(want), \
                    livereg_last_error());                                              \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define CHECK(condition)                                                                \
    do {                                                                                \
        if (!(condition)) {                                                             \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition);     \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* size bytes that end where a page ends; the page after is unmapped. */
static void *at_page_end(size_t size) {
    long page = sysconf(_SC_PAGESIZE);
    char *pages = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(pages != MAP_FAILED);
    CHECK(munmap(pages + page, (size_t)page) == 0);
    memset(pages, 0xA5, (size_t)page); /* what no zeroing program would leave */
    return pages + page - size;
}

typedef struct seen {
    volatile int drops;
    volatile int dying;
    volatile int last_reason;
    volatile int dying_before_drop;
} seen;

static void on_drop(void *userdata, const livereg_drop_event *event) {
    seen *s = (seen *)userdata;
    s->last_reason = (int)event->reason;
    s->drops++;
}

#ifdef HEADER_HAS_ON_DYING
static void on_dying(void *userdata, const livereg_drop_event *event) {
    seen *s = (seen *)userdata;
    (void)event;
    if (s->drops == 0) {
        s->dying_before_drop = 1;
    }
    s->dying++;
}
#endif

/* The callbacks as a program of its release fills them: field by field,
 * in memory nobody zeroed (the header before on_dying never asked to). */
static livereg_callbacks *callbacks(seen *s) {
    livereg_callbacks *cb = at_page_end(sizeof(livereg_callbacks));
    cb->userdata = s;
    cb->on_drop = on_drop;
    cb->on_clear = NULL;
#ifdef HEADER_HAS_ON_DYING
    cb->on_dying = on_dying;
#endif
    return cb;
}

static int wait_for(volatile int *counter, int want) {
    int waited;
    for (waited = 0; waited < 10000 && *counter < want; waited += 5) {
        usleep(5000);
    }
    return *counter >= want;
}

static livereg_table *create(const char *name) {
    livereg_options *options = at_page_end(sizeof(livereg_options));
    livereg_table *table = NULL;
    livereg_options_default(options);
    CHECK(options->capacity == 256 && options->mode == 0600);
    options->reap_timeout_ms = 2000;
    options->registration_grace_ms = 4000;
    EXPECT(livereg_create(name, options, &table), LIVEREG_OK);
    return table;
}

static uint32_t tracked(const livereg_table *table) {
    livereg_stats *stats = at_page_end(sizeof(livereg_stats));
    EXPECT(livereg_get_stats(table, stats), LIVEREG_OK);
    return stats->tracked_instances;
}

/* A reaper thread hears a SIGKILLed worker: on_drop, and on_dying only
 * when expected. */
static void killed_worker_reaches_on_drop(const char *name, int expect_dying) {
    seen s;
    livereg_table *table = create(name);
    livereg_reaper *reaper = NULL;
    pid_t child;
    int status, waited;
    memset(&s, 0, sizeof s);
    EXPECT(livereg_reaper_start(table, callbacks(&s), &reaper), LIVEREG_OK);
    child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        livereg_table *own = NULL;
        livereg_worker *worker = NULL;
        if (livereg_open(name, &own) != LIVEREG_OK ||
            livereg_register(own, 42, "old header", &worker) != LIVEREG_OK) {
            _exit(3);
        }
        for (;;) {
            livereg_ping(worker);
            usleep(10000);
        }
    }
    for (waited = 0; waited < 10000 && tracked(table) == 0; waited += 5) {
        usleep(5000);
    }
    CHECK(tracked(table) == 1);
    if (expect_dying) {
        /* Its death thread claims the process's death word just after the
         * registration: the harness says when it has (from the table's
         * status), by a line on stdin. */
        char go[8];
        printf("registered\n");
        fflush(stdout);
        CHECK(fgets(go, sizeof go, stdin) != NULL);
    }
    CHECK(kill(child, SIGKILL) == 0);
    CHECK(waitpid(child, &status, 0) == child && WIFSIGNALED(status));
    CHECK(wait_for(&s.drops, 1));
    CHECK(s.last_reason == LIVEREG_REASON_PROCESS_EXITED);
    if (expect_dying) {
        CHECK(s.dying == 1 && s.dying_before_drop);
    } else {
        CHECK(s.dying == 0);
    }
    livereg_reaper_stop(reaper);
    livereg_close(table);
}

/* A driven reaper hears a deregistration. */
static void driven_reaper_reaches_on_drop(const char *name) {
    seen s;
    livereg_table *table = create(name);
    livereg_reaper *reaper = NULL;
    livereg_worker *worker = NULL;
    uint32_t ended = 0;
    memset(&s, 0, sizeof s);
    EXPECT(livereg_reaper_acquire(table, callbacks(&s), &reaper), LIVEREG_OK);
    EXPECT(livereg_register(table, 7, "driven", &worker), LIVEREG_OK);
    EXPECT(livereg_deregister(worker), LIVEREG_OK);
    EXPECT(livereg_reaper_scan(reaper, &ended), LIVEREG_OK);
    CHECK(ended == 1 && s.drops == 1);
    CHECK(s.last_reason == LIVEREG_REASON_DEREGISTERED);
    livereg_reaper_stop(reaper);
    livereg_close(table);
}

int main(int argc, char **argv) {
    char driven[256];
    livereg_connect_options *connect = at_page_end(sizeof(livereg_connect_options));
    if (argc != 3) {
        fprintf(stderr, "usage: old_header TABLE_NAME EXPECT_DYING\n");
        return 2;
    }
    livereg_connect_options_default(connect);
    CHECK(connect->token == NULL && connect->connect_timeout_ms == 0);
    killed_worker_reaches_on_drop(argv[1], atoi(argv[2]));
    EXPECT(livereg_unlink(argv[1]), LIVEREG_OK);
    snprintf(driven, sizeof driven, "%s-driven", argv[1]);
    driven_reaper_reaches_on_drop(driven);
    EXPECT(livereg_unlink(driven), LIVEREG_OK);
    printf("old header: all checks passed\n");
    return 0;
}
