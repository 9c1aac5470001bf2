/* The C API from C (compiled as C99 and as C++11): every function, every
 * result code reachable from C, a forked child killed with SIGKILL, clear and
 * probe with a reaper thread, and a stale worker after slot reuse. */
#include <livereg.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <poll.h>
#include <unistd.h>

static int failures = 0;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n",     \
                    __FILE__, __LINE__, #cond, livereg_last_error());          \
            failures++;                                                        \
        }                                                                      \
    } while (0)

#define EXPECT(call, want)                                                     \
    do {                                                                       \
        livereg_result got_ = (call);                                          \
        if (got_ != (want)) {                                                  \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n",      \
                    __FILE__, __LINE__, #call, livereg_result_str(got_),       \
                    livereg_result_str(want), livereg_last_error());           \
            failures++;                                                        \
        }                                                                      \
    } while (0)

/* A loopback TCP port that was free a moment ago (the kernel's pick). */
static int free_tcp_port(void)
{
    struct sockaddr_in address;
    socklen_t length = sizeof address;
    int port = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&address, sizeof address) == 0 &&
        getsockname(fd, (struct sockaddr *)&address, &length) == 0) {
        port = ntohs(address.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

/* What the callbacks saw; written on the reaper thread, read after polling. */
typedef struct seen {
    volatile int drops;
    volatile int clears;
    volatile uint64_t last_id;
    volatile int last_reason;
    volatile int sleep_ms;
    volatile uint32_t last_remote;
} seen;

static void on_drop(void *userdata, const livereg_drop_event *event) {
    seen *s = (seen *)userdata;
    s->last_id = event->instance_id;
    s->last_reason = (int)event->reason;
    s->last_remote = event->remote;
    if (s->sleep_ms) {
        usleep((useconds_t)s->sleep_ms * 1000);
    }
    s->drops++;
}

static void on_clear(void *userdata) { ((seen *)userdata)->clears++; }

static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

/* Polls until *counter reaches want or 5 s pass. */
static int wait_for(volatile int *counter, int want) {
    int waited;
    for (waited = 0; waited < 5000 && *counter < want; waited += 5) {
        sleep_ms(5);
    }
    return *counter >= want;
}

static void name_for(char *out, size_t size, const char *tag) {
    snprintf(out, size, "livereg-ctest-%s-%d", tag, (int)getpid());
}

static livereg_table *create(const char *name, uint64_t timeout_ms, uint64_t grace_ms, uint32_t capacity) {
    livereg_options options;
    livereg_table *table = NULL;
    livereg_options_default(&options);
    options.capacity = capacity;
    options.reap_timeout_ms = timeout_ms;
    options.registration_grace_ms = grace_ms;
    EXPECT(livereg_create(name, &options, &table), LIVEREG_OK);
    return table;
}

static void test_defaults_and_names(void) {
    livereg_options options;
    livereg_options_default(&options);
    CHECK(options.capacity > 0);
    CHECK(options.mode == 0600);
    CHECK(options.registration_grace_ms >= options.reap_timeout_ms);
    livereg_options_default(NULL);
    CHECK(strcmp(livereg_result_str(LIVEREG_BUSY), "LIVEREG_BUSY") == 0);
    CHECK(strcmp(livereg_result_str((livereg_result)99), "LIVEREG_UNKNOWN_RESULT") == 0);
}

/* The library says its version, and the header's macros say the one it was
 * built with: this program's library is the one it was built with. */
static void test_version(void) {
    CHECK(strcmp(livereg_version(), LIVEREG_VERSION_STRING) == 0);
    CHECK(livereg_version_number() == LIVEREG_VERSION_NUMBER);
    CHECK(LIVEREG_VERSION_NUMBER == ((LIVEREG_VERSION_MAJOR << 16) |
                                     (LIVEREG_VERSION_MINOR << 8) | LIVEREG_VERSION_PATCH));
}

/* A struct travels with its size: a newer header's larger struct is taken
 * while the fields this library does not know are zero, refused
 * (INCOMPATIBLE) when one is set; a size no header declared is refused; the
 * defaults of a larger struct leave its unknown fields zero. */
static void test_sizes_travel_with_structs(void) {
    struct newer {
        livereg_callbacks known;
        void (*field_to_come)(void *userdata);
    } cb;
    struct newer_options {
        livereg_options known;
        uint64_t field_to_come;
    } options;
    livereg_table *table = NULL;
    livereg_reaper *reaper = NULL;
    char name[64];
    snprintf(name, sizeof name, "livereg-ctest-sizes-%d", (int)getpid());
    memset(&options, 0xA5, sizeof options);
    livereg_options_default_sized(&options.known, sizeof options);
    CHECK(options.field_to_come == 0 && options.known.mode == 0600);
    options.field_to_come = 1;
    EXPECT(livereg_create_sized(name, &options.known, sizeof options, &table),
           LIVEREG_INCOMPATIBLE);
    CHECK(strstr(livereg_last_error(), "livereg_options") != NULL);
    EXPECT(livereg_create_sized(name, &options.known, sizeof(livereg_options) - 8, &table),
           LIVEREG_INVALID_ARGUMENT);
    options.field_to_come = 0;
    EXPECT(livereg_create_sized(name, &options.known, sizeof options, &table), LIVEREG_OK);
    memset(&cb, 0, sizeof cb);
    cb.field_to_come = on_clear;
    EXPECT(livereg_reaper_acquire_sized(table, &cb.known, sizeof cb, &reaper),
           LIVEREG_INCOMPATIBLE);
    cb.field_to_come = NULL;
    EXPECT(livereg_reaper_acquire_sized(table, &cb.known, sizeof cb, &reaper), LIVEREG_OK);
    livereg_reaper_stop(reaper);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

static void test_null_arguments(void) {
    livereg_table *table = NULL;
    livereg_worker *worker = NULL;
    livereg_reaper *reaper = NULL;
    char name[64];
    name_for(name, sizeof name, "null");
    EXPECT(livereg_create(NULL, NULL, &table), LIVEREG_INVALID_ARGUMENT);
    CHECK(strstr(livereg_last_error(), "NULL") != NULL);
    EXPECT(livereg_create(name, NULL, NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_open(NULL, &table), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_unlink(NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_register(NULL, 1, "x", &worker), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_ping(NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_deregister(NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_clear(NULL, 10), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_probe(NULL, NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_get_stats(NULL, NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reaper_start(NULL, NULL, &reaper), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reaper_scan(NULL, NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reaper_acquire(NULL, NULL, &reaper), LIVEREG_INVALID_ARGUMENT);
    CHECK(livereg_reaper_fd(NULL) == -1);
    CHECK(livereg_reaper_next_scan_ms(NULL) == 0);
    livereg_close(NULL);
    livereg_reaper_stop(NULL);

    table = create(name, 1000, 1000, 4);
    EXPECT(livereg_register(table, 1, "x", NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_probe(table, NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_get_stats(table, NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reaper_start(table, NULL, NULL), LIVEREG_INVALID_ARGUMENT);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

static void test_registration_rules(void) {
    char name[64];
    livereg_table *table;
    livereg_worker *a = NULL, *b = NULL, *c = NULL;
    livereg_stats stats;
    char long_label[49];
    name_for(name, sizeof name, "rules");
    table = create(name, 1000, 2000, 2);
    EXPECT(livereg_create(name, NULL, &table), LIVEREG_EXISTS);
    EXPECT(livereg_create("bad name", NULL, &table), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_register(table, 0, "zero", &a), LIVEREG_INVALID_ARGUMENT);
    memset(long_label, 'x', 48);
    long_label[48] = '\0';
    EXPECT(livereg_register(table, 1, long_label, &a), LIVEREG_INVALID_ARGUMENT);
    CHECK(strstr(livereg_last_error(), "47") != NULL);
    long_label[47] = '\0';
    EXPECT(livereg_register(table, 1, long_label, &a), LIVEREG_OK);
    EXPECT(livereg_register(table, 1, "again", &b), LIVEREG_EXISTS);
    EXPECT(livereg_register(table, 2, NULL, &b), LIVEREG_OK);
    EXPECT(livereg_register(table, 3, "third", &c), LIVEREG_FULL);
    EXPECT(livereg_ping(a), LIVEREG_OK);
    EXPECT(livereg_get_stats(table, &stats), LIVEREG_OK);
    CHECK(stats.capacity == 2);
    CHECK(stats.tracked_instances == 2);
    CHECK(stats.reap_timeout_ms == 1000 && stats.registration_grace_ms == 2000);
    CHECK(stats.reaper_alive == 0);
    EXPECT(livereg_deregister(a), LIVEREG_OK);
    EXPECT(livereg_deregister(b), LIVEREG_OK);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
    EXPECT(livereg_unlink(name), LIVEREG_NOT_FOUND);
    EXPECT(livereg_open(name, &table), LIVEREG_NOT_FOUND);
}

static void test_reaper_clear_and_probe(void) {
    char name[64];
    livereg_table *table, *other = NULL;
    livereg_reaper *reaper = NULL, *second = NULL;
    livereg_worker *a = NULL, *b = NULL;
    livereg_callbacks callbacks;
    livereg_stats stats;
    seen s;
    uint64_t token = 0;
    uint32_t ended = 0;
    memset(&s, 0, sizeof s);
    name_for(name, sizeof name, "reaper");
    table = create(name, 5000, 5000, 8);
    EXPECT(livereg_probe(table, &token), LIVEREG_NO_REAPER);
    EXPECT(livereg_clear(table, 100), LIVEREG_NO_REAPER);

    memset(&callbacks, 0, sizeof callbacks); /* fields added later stay NULL */
    callbacks.userdata = &s;
    callbacks.on_drop = on_drop;
    callbacks.on_clear = on_clear;
    EXPECT(livereg_reaper_start(table, &callbacks, &reaper), LIVEREG_OK);
    EXPECT(livereg_open(name, &other), LIVEREG_OK);
    EXPECT(livereg_reaper_start(other, &callbacks, &second), LIVEREG_BUSY);
    EXPECT(livereg_reaper_acquire(other, &callbacks, &second), LIVEREG_BUSY);
    CHECK(livereg_reaper_fd(reaper) == -1);
    EXPECT(livereg_reaper_scan(reaper, &ended), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reaper_start(table, &callbacks, &second), LIVEREG_BUSY);
    EXPECT(livereg_probe(other, &token), LIVEREG_OK);
    CHECK(token != 0);
    EXPECT(livereg_get_stats(other, &stats), LIVEREG_OK);
    CHECK(stats.reaper_alive == 1 && stats.boot_token == token);

    EXPECT(livereg_register(other, 10, "a", &a), LIVEREG_OK);
    EXPECT(livereg_register(other, 11, "b", &b), LIVEREG_OK);
    /* A clear runs on_clear once and leaves every registration. */
    EXPECT(livereg_clear(other, 5000), LIVEREG_OK);
    CHECK(s.clears == 1);
    CHECK(s.drops == 0);
    EXPECT(livereg_ping(a), LIVEREG_OK);
    EXPECT(livereg_ping(b), LIVEREG_OK);
    EXPECT(livereg_get_stats(other, &stats), LIVEREG_OK);
    CHECK(stats.tracked_instances == 2);
    /* A reset ends every registration (CLEARED), then runs on_clear. */
    EXPECT(livereg_reset(NULL, 10), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reset(other, 5000), LIVEREG_OK);
    CHECK(s.clears == 2);
    CHECK(s.drops == 2);
    CHECK(s.last_reason == LIVEREG_REASON_CLEARED);
    EXPECT(livereg_ping(a), LIVEREG_EVICTED);
    EXPECT(livereg_deregister(a), LIVEREG_EVICTED);
    EXPECT(livereg_deregister(b), LIVEREG_EVICTED);

    /* A drop that takes 300 ms makes a 1 ms reset miss its deadline. */
    s.sleep_ms = 300;
    EXPECT(livereg_register(other, 12, "slow", &a), LIVEREG_OK);
    EXPECT(livereg_reset(other, 1), LIVEREG_TIMEOUT);
    CHECK(wait_for(&s.clears, 3));
    s.sleep_ms = 0;
    livereg_deregister(a);

    /* Deregistration wakes the idle reaper at once. */
    EXPECT(livereg_register(other, 13, "quits", &a), LIVEREG_OK);
    {
        int before = s.drops;
        EXPECT(livereg_deregister(a), LIVEREG_OK);
        CHECK(wait_for(&s.drops, before + 1));
        CHECK(s.last_id == 13 && s.last_reason == LIVEREG_REASON_DEREGISTERED);
    }

    livereg_reaper_stop(reaper);
    EXPECT(livereg_probe(table, &token), LIVEREG_NO_REAPER);

    /* A reaper driven by this thread: one boot token across its scans, woken
     * through its descriptor, never more than timeout/4 from a scan. */
    EXPECT(livereg_reaper_acquire(other, &callbacks, &reaper), LIVEREG_OK);
    EXPECT(livereg_reaper_start(table, &callbacks, &second), LIVEREG_BUSY);
    EXPECT(livereg_probe(table, &token), LIVEREG_OK);
    CHECK(livereg_reaper_fd(reaper) >= 0);
    {
        int i;
        uint64_t again = 0;
        for (i = 0; i < 100; i++) {
            EXPECT(livereg_reaper_scan(reaper, NULL), LIVEREG_OK);
            CHECK(livereg_reaper_next_scan_ms(reaper) <= 5000 / 4);
        }
        EXPECT(livereg_probe(table, &again), LIVEREG_OK);
        CHECK(again == token);
    }
    EXPECT(livereg_register(other, 14, "scanned", &a), LIVEREG_OK);
    EXPECT(livereg_reaper_scan(reaper, NULL), LIVEREG_OK);
    EXPECT(livereg_deregister(a), LIVEREG_OK);
    {
        struct pollfd p;
        p.fd = livereg_reaper_fd(reaper);
        p.events = POLLIN;
        p.revents = 0;
        CHECK(poll(&p, 1, 1000) == 1);
    }
    EXPECT(livereg_reaper_scan(reaper, &ended), LIVEREG_OK);
    CHECK(ended == 1);
    CHECK(s.last_id == 14 && s.last_reason == LIVEREG_REASON_DEREGISTERED);
    livereg_reaper_stop(reaper);
    livereg_close(other);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

static void test_killed_child_is_dropped(void) {
    char name[64];
    livereg_table *table;
    livereg_reaper *reaper = NULL;
    livereg_callbacks callbacks;
    seen s;
    int ready[2];
    pid_t child;
    char byte = 0;
    memset(&s, 0, sizeof s);
    name_for(name, sizeof name, "fork");
    table = create(name, 400, 800, 4);
    memset(&callbacks, 0, sizeof callbacks); /* fields added later stay NULL */
    callbacks.userdata = &s;
    callbacks.on_drop = on_drop;
    callbacks.on_clear = NULL;
    EXPECT(livereg_reaper_start(table, &callbacks, &reaper), LIVEREG_OK);
    CHECK(pipe(ready) == 0);
    child = fork();
    if (child == 0) {
        /* The child opens its own handle, registers and beats until killed. */
        livereg_table *mine = NULL;
        livereg_worker *worker = NULL;
        if (livereg_open(name, &mine) != LIVEREG_OK || livereg_register(mine, 77, "child", &worker) != LIVEREG_OK) {
            _exit(2);
        }
        if (write(ready[1], "r", 1) != 1) {
            _exit(3);
        }
        for (;;) {
            livereg_ping(worker);
            usleep(50 * 1000);
        }
    }
    CHECK(read(ready[0], &byte, 1) == 1 && byte == 'r');
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK(wait_for(&s.drops, 1));
    CHECK(s.last_id == 77);
    CHECK(s.last_reason == LIVEREG_REASON_PROCESS_EXITED);
    CHECK(s.last_remote == 0);   /* a local registration */
    livereg_reaper_stop(reaper);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

static void test_stale_worker_after_slot_reuse(void) {
    char name[64];
    livereg_table *table;
    livereg_reaper *reaper = NULL;
    livereg_worker *stale = NULL, *owner = NULL;
    livereg_callbacks callbacks;
    livereg_stats before, after;
    seen s;
    memset(&s, 0, sizeof s);
    name_for(name, sizeof name, "stale");
    table = create(name, 200, 200, 1);
    memset(&callbacks, 0, sizeof callbacks); /* fields added later stay NULL */
    callbacks.userdata = &s;
    callbacks.on_drop = on_drop;
    callbacks.on_clear = NULL;
    EXPECT(livereg_reaper_start(table, &callbacks, &reaper), LIVEREG_OK);
    EXPECT(livereg_register(table, 1, "stale", &stale), LIVEREG_OK);
    CHECK(wait_for(&s.drops, 1)); /* never pinged: ended by the grace */
    CHECK(s.last_reason == LIVEREG_REASON_GRACE);
    EXPECT(livereg_register(table, 2, "owner", &owner), LIVEREG_OK); /* the only slot, reused */
    EXPECT(livereg_ping(owner), LIVEREG_OK);
    EXPECT(livereg_get_stats(table, &before), LIVEREG_OK);
    EXPECT(livereg_ping(stale), LIVEREG_EVICTED);
    EXPECT(livereg_deregister(stale), LIVEREG_EVICTED);
    EXPECT(livereg_get_stats(table, &after), LIVEREG_OK);
    CHECK(after.tracked_instances == 1);
    CHECK(after.ended_total == before.ended_total);
    EXPECT(livereg_ping(owner), LIVEREG_OK);
    EXPECT(livereg_deregister(owner), LIVEREG_OK);
    livereg_reaper_stop(reaper);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

static void test_bad_tables_and_permissions(void) {
    char path[96], name[64];
    livereg_table *table = NULL;
    unsigned char bytes[4096];
    size_t i;
    int fd;
    pid_t child;
    int status = 0;

    /* A foreign file: CORRUPT. */
    snprintf(path, sizeof path, "/tmp/livereg-ctest-foreign-%d", (int)getpid());
    for (i = 0; i < sizeof bytes; i++) {
        bytes[i] = (unsigned char)(i * 131u + 7u);
    }
    fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, bytes, sizeof bytes) == (ssize_t)sizeof bytes);
    close(fd);
    EXPECT(livereg_open(path, &table), LIVEREG_CORRUPT);
    unlink(path);

    /* Another major version: INCOMPATIBLE. */
    snprintf(path, sizeof path, "/tmp/livereg-ctest-version-%d", (int)getpid());
    table = create(path, 1000, 1000, 1);
    livereg_close(table);
    fd = open(path, O_WRONLY);
    {
        uint32_t major = 9;
        CHECK(pwrite(fd, &major, sizeof major, 8) == (ssize_t)sizeof major);
    }
    close(fd);
    EXPECT(livereg_open(path, &table), LIVEREG_INCOMPATIBLE);
    CHECK(strstr(livereg_last_error(), "version 9") != NULL);
    EXPECT(livereg_unlink(path), LIVEREG_OK);

    /* A directory is not a table: IO. */
    EXPECT(livereg_create("/tmp/", NULL, &table), LIVEREG_IO);

    /* Another user cannot open a 0600 table: PERMISSION (needs root to switch). */
    if (geteuid() == 0) {
        name_for(name, sizeof name, "perm");
        table = create(name, 1000, 1000, 1);
        child = fork();
        if (child == 0) {
            livereg_table *theirs = NULL;
            if (setgid(65534) != 0 || setuid(65534) != 0) {
                _exit(3);
            }
            _exit(livereg_open(name, &theirs) == LIVEREG_PERMISSION ? 0 : 1);
        }
        waitpid(child, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        livereg_close(table);
        EXPECT(livereg_unlink(name), LIVEREG_OK);
    } else {
        printf("not root: LIVEREG_PERMISSION is not exercised\n");
    }
}

/* What a re-entrant callback got back from the library. */
typedef struct reentry {
    livereg_table *table;
    volatile int done;
    volatile livereg_result clear;
    volatile livereg_result again;
} reentry;

static void reenter(void *userdata, const livereg_drop_event *event) {
    reentry *r = (reentry *)userdata;
    livereg_worker *worker = NULL;
    r->clear = livereg_clear(r->table, 5000);
    r->again = livereg_register(r->table, event->instance_id, "again", &worker);
    r->done = 1;
}

/* A callback that would wait on its own reaper gets BUSY at once. */
static void test_reentrant_callbacks_fail_at_once(void) {
    char name[128];
    livereg_table *table;
    livereg_reaper *reaper = NULL;
    livereg_worker *worker = NULL;
    livereg_callbacks callbacks;
    reentry r;
    memset(&callbacks, 0, sizeof callbacks);
    memset(&r, 0, sizeof r);
    name_for(name, sizeof name, "reenter");
    table = create(name, 1000, 2000, 4);
    r.table = table;
    callbacks.userdata = &r;
    callbacks.on_drop = reenter;
    EXPECT(livereg_reaper_start(table, &callbacks, &reaper), LIVEREG_OK);
    EXPECT(livereg_register(table, 21, "w", &worker), LIVEREG_OK);
    EXPECT(livereg_deregister(worker), LIVEREG_OK);
    CHECK(wait_for(&r.done, 1));
    CHECK(r.clear == LIVEREG_BUSY);
    CHECK(r.again == LIVEREG_BUSY);
    livereg_reaper_stop(reaper);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

/* What a driven reaper's callback got back when it called into its own reaper. */
typedef struct driven_reentry {
    livereg_reaper *reaper;
    int calls;
    livereg_result scan;
    uint64_t next_ms;
    livereg_result listen;
    char address[160];
} driven_reentry;

static void reenter_driven(void *userdata, const livereg_drop_event *event) {
    driven_reentry *r = (driven_reentry *)userdata;
    (void)event;
    r->calls++;
    r->scan = livereg_reaper_scan(r->reaper, NULL);   /* would hang on its own lock */
    r->next_ms = livereg_reaper_next_scan_ms(r->reaper); /* likewise */
    r->listen = livereg_reaper_listen(r->reaper, r->address, NULL); /* would alias the scanning reaper */
    livereg_reaper_stop(r->reaper);                     /* would free the reaper mid-scan */
}

/* A driven reaper re-entered from its own callback: BUSY at once, never a
 * hang, never a free of what the scan is using. */
static void test_driven_reaper_reentered_from_its_callback(void) {
    char name[128];
    livereg_table *table;
    livereg_worker *worker = NULL;
    livereg_callbacks callbacks;
    driven_reentry r;
    uint32_t ended = 0;
    memset(&callbacks, 0, sizeof callbacks);
    memset(&r, 0, sizeof r);
    name_for(name, sizeof name, "reenter-driven");
    snprintf(r.address, sizeof r.address, "unix:/tmp/%s.sock", name);
    table = create(name, 1000, 2000, 4);
    callbacks.userdata = &r;
    callbacks.on_drop = reenter_driven;
    callbacks.on_clear = NULL;
    EXPECT(livereg_reaper_acquire(table, &callbacks, &r.reaper), LIVEREG_OK);
    EXPECT(livereg_register(table, 22, "w", &worker), LIVEREG_OK);
    EXPECT(livereg_deregister(worker), LIVEREG_OK);
    EXPECT(livereg_reaper_scan(r.reaper, &ended), LIVEREG_OK);
    CHECK(ended == 1 && r.calls == 1);
    CHECK(r.scan == LIVEREG_BUSY);
    CHECK(r.next_ms == 0);
    CHECK(r.listen == LIVEREG_BUSY);
    CHECK(strstr(livereg_last_error(), "livereg_reaper_stop") != NULL);
    /* The handle survived its callback's stop: it still scans, then stops. */
    CHECK(livereg_reaper_fd(r.reaper) >= 0);
    EXPECT(livereg_reaper_scan(r.reaper, &ended), LIVEREG_OK);
    livereg_reaper_stop(r.reaper);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

/* Progress beside liveness: busy, steps, and the option that judges them. */
static void test_progress(void) {
    char name[128];
    livereg_options options;
    livereg_table *table = NULL;
    livereg_worker *worker = NULL;
    livereg_stats stats;
    name_for(name, sizeof name, "progress");
    livereg_options_default(&options);
    CHECK(options.progress_timeout_ms == 0);
    options.reap_timeout_ms = 1000;
    options.registration_grace_ms = 2000;
    options.progress_timeout_ms = 100; /* below one scan interval (250 ms) */
    EXPECT(livereg_create(name, &options, &table), LIVEREG_INVALID_ARGUMENT);
    options.progress_timeout_ms = 2000;
    EXPECT(livereg_create(name, &options, &table), LIVEREG_OK);
    EXPECT(livereg_register(table, 30, "engine", &worker), LIVEREG_OK);
    EXPECT(livereg_set_busy(worker, 1), LIVEREG_OK);
    EXPECT(livereg_progress(worker), LIVEREG_OK);
    EXPECT(livereg_set_busy(worker, 0), LIVEREG_OK);
    EXPECT(livereg_progress(NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_set_busy(NULL, 1), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_get_stats(table, &stats), LIVEREG_OK);
    CHECK(stats.ended_by_reason[LIVEREG_REASON_STALLED] == 0);
    EXPECT(livereg_deregister(worker), LIVEREG_OK);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

/* The info area: published by one handle, read by another, bounded. */
static void test_info_area(void) {
    char name[128];
    livereg_table *table, *other = NULL;
    char big[1025];
    char buf[64];
    size_t len = 99;
    memset(big, 'x', sizeof big);
    name_for(name, sizeof name, "info");
    table = create(name, 1000, 2000, 2);
    EXPECT(livereg_get_info(table, buf, sizeof buf, &len), LIVEREG_OK);
    CHECK(len == 0);
    EXPECT(livereg_set_info(table, "{\"chunk_size\":256}", 18), LIVEREG_OK);
    EXPECT(livereg_open(name, &other), LIVEREG_OK);
    EXPECT(livereg_get_info(other, buf, sizeof buf, &len), LIVEREG_OK);
    CHECK(len == 18 && memcmp(buf, "{\"chunk_size\":256}", 18) == 0);
    EXPECT(livereg_get_info(other, buf, 4, &len), LIVEREG_INVALID_ARGUMENT);
    CHECK(len == 18);
    EXPECT(livereg_set_info(table, big, sizeof big), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_set_info(table, NULL, 5), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_get_info(other, NULL, 0, NULL), LIVEREG_INVALID_ARGUMENT);
    livereg_close(other);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

/* The metrics text: its size asked for first, then written whole. */
static void test_metrics_text(void) {
    char name[128];
    char expected[256];
    livereg_table *table;
    livereg_worker *worker = NULL;
    size_t len = 0;
    char *text;
    name_for(name, sizeof name, "metrics");
    table = create(name, 1000, 2000, 2);
    EXPECT(livereg_register(table, 5, "gpu5", &worker), LIVEREG_OK);
    EXPECT(livereg_metrics_text(table, NULL, 0, &len), LIVEREG_INVALID_ARGUMENT);
    CHECK(len > 0);
    text = (char *)malloc(len + 1);
    EXPECT(livereg_metrics_text(table, text, len + 1, &len), LIVEREG_OK);
    CHECK(strlen(text) == len);
    snprintf(expected, sizeof expected, "livereg_registrations{table=\"%s\"} 1\n", name);
    CHECK(strstr(text, expected) != NULL);
    CHECK(len >= 6 && strcmp(text + len - 6, "# EOF\n") == 0);
    EXPECT(livereg_metrics_text(table, text, 4, &len), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_metrics_text(NULL, text, len + 1, &len), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_metrics_text(table, text, len + 1, NULL), LIVEREG_INVALID_ARGUMENT);
    free(text);
    EXPECT(livereg_deregister(worker), LIVEREG_OK);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

/* Scans a driven reaper (waiting on its descriptor) until a drop is seen or
 * 5 s pass. */
static void scan_until_dropped(livereg_reaper *reaper, seen *s, int drops) {
    int waited_ms = 0;
    while (s->drops < drops && waited_ms < 5000) {
        struct pollfd p;
        p.fd = livereg_reaper_fd(reaper);
        p.events = POLLIN;
        p.revents = 0;
        poll(&p, 1, 10);
        EXPECT(livereg_reaper_scan(reaper, NULL), LIVEREG_OK);
        waited_ms += 10;
    }
}

/* Sessions: a driven reaper listens; workers register through it with
 * livereg_connect, beat, read the info, and end deregistered or (killed)
 * disconnected; a live id, a wrong token and a tcp:// listener without a
 * token are refused. */
static void test_sessions(void) {
    char name[128], address[160], tcp[64];
    livereg_table *table;
    livereg_reaper *reaper = NULL;
    livereg_worker *worker = NULL, *again = NULL;
    livereg_callbacks callbacks;
    livereg_connect_options opts;
    seen s;
    char info[16];
    size_t len = 0;
    pid_t child;
    int status = 0;
    int attempt;
    livereg_result listened = LIVEREG_IO;
    memset(&s, 0, sizeof s);
    memset(&callbacks, 0, sizeof callbacks);
    name_for(name, sizeof name, "sessions");
    snprintf(address, sizeof address, "unix:/tmp/%s.sock", name);
    table = create(name, 30000, 30000, 4);
    EXPECT(livereg_set_info(table, "chunk=256", 9), LIVEREG_OK);
    callbacks.userdata = &s;
    callbacks.on_drop = on_drop;
    callbacks.on_clear = on_clear;
    EXPECT(livereg_reaper_acquire(table, &callbacks, &reaper), LIVEREG_OK);
    EXPECT(livereg_reaper_listen(NULL, address, NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reaper_listen(reaper, "unix:relative.sock", NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reaper_listen(reaper, "tcp://127.0.0.1:0", NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_reaper_listen(reaper, address, NULL), LIVEREG_OK);
    EXPECT(livereg_reaper_listen(reaper, address, NULL), LIVEREG_BUSY);

    EXPECT(livereg_connect(NULL, NULL, 40, "w", &worker), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_connect(address, NULL, 40, "w", NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_connect(address, NULL, 40, "w", &worker), LIVEREG_OK);
    EXPECT(livereg_ping(worker), LIVEREG_OK);
    EXPECT(livereg_set_busy(worker, 1), LIVEREG_OK);
    EXPECT(livereg_progress(worker), LIVEREG_OK);
    EXPECT(livereg_worker_get_info(worker, info, sizeof info, &len), LIVEREG_OK);
    CHECK(len == 9 && memcmp(info, "chunk=256", 9) == 0);
    EXPECT(livereg_worker_get_info(worker, info, 2, &len), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_connect(address, NULL, 40, "w", &again), LIVEREG_EXISTS);
    CHECK(again == NULL);
    EXPECT(livereg_ping(worker), LIVEREG_OK);
    EXPECT(livereg_deregister(worker), LIVEREG_OK);
    scan_until_dropped(reaper, &s, 1);
    CHECK(s.drops == 1 && s.last_id == 40 && s.last_reason == LIVEREG_REASON_DEREGISTERED);

    /* A child registered over the socket, killed: disconnected at once
     * (the table's timeout is 30 s). */
    child = fork();
    if (child == 0) {
        livereg_worker *mine = NULL;
        if (livereg_connect(address, NULL, 41, "child", &mine) != LIVEREG_OK) {
            _exit(3);
        }
        for (;;) {
            livereg_ping(mine);
            usleep(10000);
        }
    }
    while (s.drops == 1) {
        livereg_stats stats;
        EXPECT(livereg_get_stats(table, &stats), LIVEREG_OK);
        if (stats.tracked_instances == 1) {
            break;
        }
        usleep(5000);
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    scan_until_dropped(reaper, &s, 2);
    CHECK(s.drops == 2 && s.last_id == 41 && s.last_reason == LIVEREG_REASON_DISCONNECTED);

    /* tcp:// needs its token. A port another process took between our
     * look and the bind is tried again with another. */
    for (attempt = 0; attempt < 20; attempt++) {
        snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%d", free_tcp_port());
        listened = livereg_reaper_listen(reaper, tcp, "s3cret");
        if (listened != LIVEREG_IO) {
            break;
        }
    }
    EXPECT(listened, LIVEREG_OK);
    livereg_connect_options_default(&opts);
    CHECK(opts.token == NULL && opts.connect_timeout_ms == 0);
    opts.token = "wrong";
    worker = NULL;
    EXPECT(livereg_connect(tcp, &opts, 42, "w", &worker), LIVEREG_PERMISSION);
    CHECK(strstr(livereg_last_error(), "token") != NULL);
    opts.token = "s3cret";
    EXPECT(livereg_connect(tcp, &opts, 42, "w", &worker), LIVEREG_OK);
    if (worker != NULL) {
        EXPECT(livereg_deregister(worker), LIVEREG_OK);
    }
    scan_until_dropped(reaper, &s, 3);
    CHECK(s.drops == 3 && s.last_id == 42);

    /* An engine asks for a clear, then a reset, through its session (in a
     * child: this thread drives the reaper's scans). */
    EXPECT(livereg_worker_clear(NULL, 10), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_worker_reset(NULL, 10), LIVEREG_INVALID_ARGUMENT);
    child = fork();
    if (child == 0) {
        livereg_worker *mine = NULL;
        int i;
        if (livereg_connect(tcp, &opts, 43, "child", &mine) != LIVEREG_OK) {
            _exit(3);
        }
        if (livereg_worker_clear(mine, 10000) != LIVEREG_OK) {
            _exit(4);
        }
        if (livereg_ping(mine) != LIVEREG_OK) {
            _exit(5); /* a clear evicts nobody */
        }
        if (livereg_worker_reset(mine, 10000) != LIVEREG_OK) {
            _exit(6);
        }
        /* The reset ended its own registration too: a ping hears it. */
        for (i = 0; i < 500 && livereg_ping(mine) == LIVEREG_OK; i++) {
            usleep(10000);
        }
        _exit(livereg_ping(mine) == LIVEREG_EVICTED ? 0 : 7);
    }
    while (waitpid(child, &status, WNOHANG) == 0) {
        uint32_t ended = 0;
        EXPECT(livereg_reaper_scan(reaper, &ended), LIVEREG_OK);
        usleep(2000);
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(s.clears == 2);
    CHECK(s.drops == 4 && s.last_id == 43 && s.last_reason == LIVEREG_REASON_CLEARED);
    livereg_reaper_stop(reaper);
    livereg_close(table);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

/* A forked child owns a file in /dev/shm and is killed: the reaper removes
 * the file once the child has ended, never before. */
static void test_owned_files(void) {
    char name[64], path[128];
    livereg_table *table;
    livereg_reaper *reaper = NULL;
    livereg_callbacks callbacks;
    int ready[2], fd, tries;
    char byte = 0;
    pid_t child;
    name_for(name, sizeof name, "owned");
    snprintf(path, sizeof path, "/dev/shm/%s-ring", name);
    table = create(name, 5000, 5000, 4);
    EXPECT(livereg_own_file(table, NULL), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_own_file(NULL, path), LIVEREG_INVALID_ARGUMENT);
    EXPECT(livereg_own_file(table, path), LIVEREG_NOT_FOUND);
    EXPECT(livereg_own_file(table, "/tmp"), LIVEREG_INVALID_ARGUMENT);
    CHECK(strstr(livereg_last_error(), "allowed directory") != NULL);
    fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    CHECK(fd >= 0);
    CHECK(write(fd, "ring", 4) == 4);
    close(fd);
    /* Owned, then disowned by this process: it stays. */
    EXPECT(livereg_own_file(table, path), LIVEREG_OK);
    EXPECT(livereg_disown_file(table, path), LIVEREG_OK);
    EXPECT(livereg_disown_file(table, path), LIVEREG_NOT_FOUND);
    CHECK(pipe(ready) == 0);
    child = fork();
    if (child == 0) {
        livereg_table *mine = NULL;
        livereg_result r = livereg_open(name, &mine);
        if (r == LIVEREG_OK) r = livereg_own_file(mine, path);
        byte = (char)r;
        if (write(ready[1], &byte, 1) != 1) _exit(2);
        for (;;) pause();
    }
    CHECK(read(ready[0], &byte, 1) == 1 && byte == LIVEREG_OK);
    memset(&callbacks, 0, sizeof callbacks);
    EXPECT(livereg_reaper_start(table, &callbacks, &reaper), LIVEREG_OK);
    sleep_ms(300);
    CHECK(access(path, F_OK) == 0); /* its maker lives */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    for (tries = 0; tries < 1000 && access(path, F_OK) == 0; tries++) sleep_ms(10);
    CHECK(access(path, F_OK) != 0);
    livereg_reaper_stop(reaper);
    livereg_close(table);
    unlink(path);
    close(ready[0]);
    close(ready[1]);
    EXPECT(livereg_unlink(name), LIVEREG_OK);
}

int main(void) {
    test_defaults_and_names();
    test_version();
    test_sizes_travel_with_structs();
    test_null_arguments();
    test_registration_rules();
    test_reaper_clear_and_probe();
    test_killed_child_is_dropped();
    test_stale_worker_after_slot_reuse();
    test_bad_tables_and_permissions();
    test_reentrant_callbacks_fail_at_once();
    test_driven_reaper_reentered_from_its_callback();
    test_info_area();
    test_progress();
    test_metrics_text();
    test_sessions();
    test_owned_files();
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("all C API checks passed\n");
    return 0;
}
