/*
 * livereg.h - a lock-free shared-memory liveness registry.
 *
 * Worker processes register in a table in shared memory (/dev/shm/NAME) and
 * prove they are alive with livereg_ping(): one clock read and one atomic
 * compare-and-swap on their own slot, no system call, no lock. A reaper (a
 * thread of your server, or the `livereg reap` daemon) ends registrations that
 * went silent or whose process died, and calls your on_drop callback so you
 * can free what you held for that worker.
 *
 * API conventions
 * ---------------
 * Errors:    every fallible function returns a livereg_result. On failure,
 *            livereg_last_error() returns a message for this thread, naming
 *            what was expected and what was found.
 * NULL:      a NULL where a pointer is required returns
 *            LIVEREG_INVALID_ARGUMENT. Arguments documented "may be NULL" are
 *            optional. Close/stop functions ignore NULL.
 * Ownership: handles (livereg_table, livereg_worker, livereg_reaper) are
 *            opaque. You own each one until you pass it to livereg_close,
 *            livereg_deregister or livereg_reaper_stop; never use it after.
 *            Workers and reapers stay valid after their table handle is
 *            closed. Strings you pass are copied; strings returned are owned
 *            by the library.
 * Threads:   every function may be called from any thread. One handle may be
 *            used from several threads at once, except that a handle must not
 *            be freed while another thread uses it. Callbacks run on the
 *            reaper's handler threads (livereg_reaper_start), several at once
 *            when one is slow (so one stuck callback never delays the drops
 *            of other workers): make them, and userdata, thread-safe. A
 *            reaper from livereg_reaper_acquire runs them on the thread that
 *            calls livereg_reaper_scan.
 * Panics:    no Rust panic crosses this boundary; an internal bug returns
 *            LIVEREG_PANIC.
 * ABI:       a program built against this header runs, unchanged,
 *            against every later liblivereg.so.1 (and one built against the
 *            header of any release back to the one before on_dying does
 *            too). A struct you fill, or lend the library to fill
 *            (livereg_options, livereg_callbacks, livereg_connect_options,
 *            livereg_stats), never changes what its bytes mean; it only
 *            grows, by fields added at its end, and travels with its size:
 *            the functions taking one are macros passing sizeof (as this
 *            header declares it) to their *_sized entry point, so the
 *            library reads and writes only your struct's bytes, and the
 *            fields you did not know of stay off. Zero a struct before
 *            filling it ({0}, memset, or its _default function). A library
 *            older than your header refuses a struct with a field it does
 *            not know set (LIVEREG_INCOMPATIBLE); check
 *            livereg_version_number() at start-up to refuse it earlier.
 *            The plain entry points (livereg_create, ... without _sized),
 *            which programs built before sizes travelled call, read and
 *            write those structs as that release declared them, forever;
 *            livereg_reaper_start and livereg_reaper_acquire read the three
 *            words livereg_callbacks had before on_dying, and tell no such
 *            program of dying (one built against a header with on_dying
 *            but no sizes: start it with
 *            LIVEREG_LEGACY_CALLBACKS_HAVE_ON_DYING=1, or rebuild).
 *            Bindings from other languages call the *_sized entry points
 *            with the size of the struct they lay out.
 *            Structs the library hands you (livereg_drop_event) may grow at
 *            their end too: read the fields you know. The table layout
 *            carries a version: a table made by a library with another
 *            major layout version, or another slot size, is refused with
 *            LIVEREG_INCOMPATIBLE; a table whose contents are impossible
 *            with LIVEREG_CORRUPT. Result and reason values below are
 *            stable. Versions: docs/c-api.md, "Versions and the ABI".
 * Time:      times are CLOCK_MONOTONIC nanoseconds. On a table that stamps
 *            heartbeats coarsely (the default where the timeout is at least
 *            200 kernel ticks), a heartbeat time is CLOCK_MONOTONIC_COARSE:
 *            up to a few ticks before the ping. The reaper allows for it
 *            (never early; up to 6 ticks late).
 * Dying:     opening a shared table (livereg_open, livereg_create)
 *            starts one small library thread ("livereg-death", 64 KiB of
 *            stack, parked) that lives until the handle is closed. While
 *            the process has registrations there, the thread owns the
 *            process's death word (in NAME.dying beside the table; given
 *            back at the last deregistration), which the kernel marks as
 *            the process begins to die (SIGKILL, a crash, exit, exec),
 *            before its memory and files are torn down: the reaper calls
 *            on_dying within about a millisecond, whatever the process
 *            holds, and on_drop once it has ended. Registrations from a
 *            thread that then ends, forked children and stopped processes
 *            are never reported dying; exec() ends the process's
 *            registrations. Set LIVEREG_NO_DEATH_THREAD=1 in the process's
 *            environment before opening to start no thread (its death is
 *            then seen once it has ended, as on a kernel without
 *            set_robust_list).
 * Durations: a span of time is uint64_t milliseconds, named *_ms; a call's
 *            bound on its own waiting is its wait_ms, a connection's
 *            connect_timeout_ms, a table's budgets *_timeout_ms and
 *            registration_grace_ms.
 */
#ifndef LIVEREG_H
#define LIVEREG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of livereg this header is from, and the C ABI's major version
 * (the N of the library's name, liblivereg.so.N). Compare the library's own
 * at start-up to refuse one older than this header:
 *
 *     if (livereg_version_number() < LIVEREG_VERSION_NUMBER) refuse();
 */
#define LIVEREG_VERSION_MAJOR 0
#define LIVEREG_VERSION_MINOR 1
#define LIVEREG_VERSION_PATCH 0
#define LIVEREG_VERSION_STRING "0.1.0"
#define LIVEREG_VERSION_NUMBER \
    ((LIVEREG_VERSION_MAJOR << 16) | (LIVEREG_VERSION_MINOR << 8) | LIVEREG_VERSION_PATCH)
#define LIVEREG_ABI_MAJOR 1

/* The library's version, "MAJOR.MINOR.PATCH" (static, never NULL), and as
 * (MAJOR << 16) | (MINOR << 8) | PATCH: what liblivereg.so.1 was loaded. */
const char *livereg_version(void);
uint32_t livereg_version_number(void);

/* Results. Values are stable. */
typedef enum livereg_result {
    LIVEREG_OK = 0,               /* success */
    LIVEREG_EVICTED = 1,          /* the worker's registration has ended: register again */
    LIVEREG_FULL = 2,             /* every slot of the table is taken */
    LIVEREG_EXISTS = 3,           /* the table exists, or the instance id is live */
    LIVEREG_NOT_FOUND = 4,        /* no table of that name */
    LIVEREG_INVALID_ARGUMENT = 5, /* NULL, bad name, id 0, label over 47 bytes, bad options */
    LIVEREG_INCOMPATIBLE = 6,     /* table made by another layout version or slot size */
    LIVEREG_CORRUPT = 7,          /* not a livereg table, wrong size, unfinished header */
    LIVEREG_PERMISSION = 8,       /* the OS refused access (mode, owner) */
    LIVEREG_TIMEOUT = 9,          /* a deadline passed */
    LIVEREG_NO_REAPER = 10,       /* no reaper is alive */
    LIVEREG_BUSY = 11,            /* another reaper holds the table */
    LIVEREG_IO = 12,              /* another OS failure */
    LIVEREG_PANIC = 13            /* internal bug caught at the boundary */
} livereg_result;

/* Why a registration ended. Values are stable. */
typedef enum livereg_reason {
    LIVEREG_REASON_TIMEOUT = 1,        /* beat, then silent for reap_timeout */
    LIVEREG_REASON_GRACE = 2,          /* never beat, silent for registration_grace */
    LIVEREG_REASON_PROCESS_EXITED = 3, /* its process exited or was killed */
    LIVEREG_REASON_DEREGISTERED = 4,   /* livereg_deregister: a clean exit */
    LIVEREG_REASON_CLEARED = 5,        /* livereg_reset ended every registration */
    LIVEREG_REASON_REPLACED = 6,       /* a new registration of the id replaced it */
    LIVEREG_REASON_STALLED = 7,        /* busy with no progress for progress_timeout */
    LIVEREG_REASON_DISCONNECTED = 8    /* a session's connection closed without a deregistration */
} livereg_reason;

/* Opaque handles. */
typedef struct livereg_table livereg_table;
typedef struct livereg_worker livereg_worker;
typedef struct livereg_reaper livereg_reaper;

/* How livereg_create makes a table. Fill with livereg_options_default first. */
typedef struct livereg_options {
    uint32_t capacity;              /* slots, 1 to 1048576 (default 256) */
    uint32_t mode;                  /* permission bits, must include 0600 (default 0600) */
    uint64_t reap_timeout_ms;       /* silence budget after a ping; 0 disables reaping (default 10000) */
    uint64_t registration_grace_ms; /* silence budget with no ping yet; >= reap_timeout_ms (default 30000) */
    uint64_t progress_timeout_ms;   /* a busy worker's budget without progress; 0 off (default), else >= reap_timeout_ms/4 */
} livereg_options;

/* A snapshot of a table, filled by livereg_get_stats. */
typedef struct livereg_stats {
    uint32_t capacity;
    uint32_t tracked_instances;     /* live registrations */
    uint32_t reaper_alive;          /* 1 if a reaper holds the table and scans */
    uint32_t reaper_pid;            /* 0 if none recorded */
    uint64_t boot_token;            /* changes whenever a reaper (re)starts */
    uint64_t reap_timeout_ms;
    uint64_t registration_grace_ms;
    uint64_t ended_total;           /* registrations ended since creation */
    uint64_t ended_by_reason[16];   /* indexed by livereg_reason; [0] and reasons to come are 0 */
    uint64_t handler_failures;
    uint64_t scans;
} livereg_stats;

/* What on_drop receives. Valid only during the callback: copy what you keep. */
typedef struct livereg_drop_event {
    uint64_t instance_id;
    uint32_t slot;
    uint32_t generation;            /* with slot, names this registration uniquely */
    livereg_reason reason;
    uint32_t pid;                   /* in the registrant's PID namespace */
    uint64_t registered_ns;         /* registrant's CLOCK_MONOTONIC */
    uint64_t last_heartbeat_ns;     /* 0 if it never pinged */
    uint64_t silent_ns;             /* silence the reaper judged (0 for explicit endings) */
    char label[48];                 /* NUL-terminated UTF-8 */
    uint32_t remote;                /* 1: a session's client (registered through a listener;
                                       its pid is in the client's own PID namespace), else 0 */
} livereg_drop_event;

/* Reaper callbacks; any may be NULL. Zero the struct ({0} or memset) before
 * filling it: fields added at its end in later releases then stay NULL
 * (and the size travels with it: see "ABI" above).
 * They must return (no longjmp, no C++ exception); a slot is freed (and its
 * instance id may register again) only after its on_drop returned. A
 * callback that runs past 30 s is logged and counted (handlers_overdue) but
 * never interrupted. */
typedef struct livereg_callbacks {
    void *userdata;                 /* passed back to every callback */
    void (*on_drop)(void *userdata, const livereg_drop_event *event);
    void (*on_clear)(void *userdata);
    /* The registration's process began to die (see "Dying" above): called
     * once, before its on_drop, with the event on_drop will get; the
     * process runs no more of its code, but until on_drop a device it
     * drives may still write memory it shared. */
    void (*on_dying)(void *userdata, const livereg_drop_event *event);
} livereg_callbacks;

/* Fills *out with the defaults. NULL is ignored. */
void livereg_options_default(livereg_options *out);
void livereg_options_default_sized(livereg_options *out, size_t size);
#define livereg_options_default(out) livereg_options_default_sized((out), sizeof(livereg_options))

/* Creates table `name` exclusively (a /dev/shm name of 1-200 characters
 * [A-Za-z0-9._-], or a path containing '/'). opts may be NULL (defaults).
 * On LIVEREG_OK, *out is a new handle: close it with livereg_close.
 * Errors: EXISTS, INVALID_ARGUMENT, PERMISSION, IO. */
livereg_result livereg_create(const char *name, const livereg_options *opts, livereg_table **out);
livereg_result livereg_create_sized(const char *name, const livereg_options *opts,
                                    size_t opts_size, livereg_table **out);
#define livereg_create(name, opts, out) \
    livereg_create_sized((name), (opts), sizeof(livereg_options), (out))

/* Opens and validates an existing table. Waits up to 1 s for a creator that
 * has not finished. Errors: NOT_FOUND, PERMISSION, INCOMPATIBLE, CORRUPT,
 * INVALID_ARGUMENT, IO. */
livereg_result livereg_open(const char *name, livereg_table **out);

/* Frees a table handle (NULL is ignored). The table itself remains. */
void livereg_close(livereg_table *table);

/* Removes the table's name; processes that have it open keep using it.
 * Errors: NOT_FOUND, PERMISSION, INVALID_ARGUMENT, IO. */
livereg_result livereg_unlink(const char *name);

/* Registers instance_id (not 0) with a label of at most 47 bytes of UTF-8
 * (label may be NULL). The registration lives until livereg_deregister, an
 * eviction, or this process's exit. On LIVEREG_OK, *out is a new handle.
 * It waits at most 5 s in all: for the registration lock another process
 * holds, and while the id's previous registration is still being dropped,
 * for that drop. Errors: INVALID_ARGUMENT, EXISTS (the id is live), FULL,
 * BUSY (the lock was held or the previous drop did not finish within the
 * 5 s, or no reaper is alive to finish it, or this is the reaper's own
 * callback for that drop), IO. */
livereg_result livereg_register(const livereg_table *table, uint64_t instance_id,
                                const char *label, livereg_worker **out);

/* Heartbeat: LIVEREG_OK, or LIVEREG_EVICTED once the registration has ended
 * (then deregister the handle and register again). No system call, no lock. */
livereg_result livereg_ping(const livereg_worker *worker);

/* Progress beside liveness: a heartbeat from a side thread proves the process
 * alive, not that its engine moves. Mark the worker busy while it has work in
 * flight and call livereg_progress at every step of its loop (one atomic add,
 * no clock, no system call). With the table's progress_timeout_ms > 0, a busy
 * worker that makes no progress for that long ends with reason STALLED; an
 * idle one never does. Both return LIVEREG_OK or LIVEREG_EVICTED. */
livereg_result livereg_set_busy(const livereg_worker *worker, int busy);
livereg_result livereg_progress(const livereg_worker *worker);

/* Ends the registration cleanly (reason DEREGISTERED) and always frees the
 * handle. Returns LIVEREG_EVICTED if it had already ended. */
livereg_result livereg_deregister(livereg_worker *worker);

/* Asks the reaper to run its on_clear callbacks once (the server clears its
 * stored cache) and waits up to wait_ms. Registrations are untouched:
 * workers keep beating. Requests made while one is pending share it.
 * Errors: NO_REAPER, TIMEOUT; BUSY from inside this table's own callbacks. */
livereg_result livereg_clear(const livereg_table *table, uint64_t wait_ms);

/* As livereg_clear, but first ends every registration (reason CLEARED): their
 * on_drop callbacks run, then on_clear, before it returns; workers get
 * LIVEREG_EVICTED at their next ping and register again. Same errors. */
livereg_result livereg_reset(const livereg_table *table, uint64_t wait_ms);

/* Owned files: declares that this process owns the file at path (one it
 * made that must not outlive it, such as a shared-memory segment): the
 * reaper removes it once this process has ended (killed, crashed, exited
 * or exec'd), whether or not it holds a registration then. Nothing is
 * removed while the process lives. The file must be a regular file named
 * directly in a directory the table's creator allowed (default /dev/shm),
 * not a link, and of this process's user (root may own any user's, where
 * only root may write the table; elsewhere only files of the table's
 * owner are owned). The reaper removes the name only if it still holds
 * that same file (device and inode), never through a link. Declaring a
 * path again updates it; a forked child owns nothing of its parent's; the
 * declaration outlives livereg_close. At most 64 files per process and 256
 * processes per table. Errors: INVALID_ARGUMENT (NULL, a path outside the
 * allowed directories, a name over 255 bytes, a link or not a regular
 * file), NOT_FOUND (no such file), PERMISSION (another user's file), FULL
 * (a limit; the message names it), INCOMPATIBLE (a table made by an
 * earlier build). */
livereg_result livereg_own_file(const livereg_table *table, const char *path);

/* Forgets a declaration of livereg_own_file; the file stays. Errors:
 * NOT_FOUND (this process does not own it in this table). */
livereg_result livereg_disown_file(const livereg_table *table, const char *path);

/* If a reaper is alive, writes its boot token. Errors: NO_REAPER. */
livereg_result livereg_probe(const livereg_table *table, uint64_t *boot_token);

/* The table's reaper, as livereg_reaper_state and livereg_reaper_wait
 * write it. Values are stable. */
typedef enum livereg_reaper_life {
    LIVEREG_REAPER_ABSENT = 0,  /* no reaper holds the table */
    LIVEREG_REAPER_SERVING = 1, /* a reaper holds the table and serves */
    LIVEREG_REAPER_DYING = 2    /* its process began to end (SIGKILL, the OOM killer, a crash) */
} livereg_reaper_life;

/* The table's reaper now, in a few loads of the table's header: writes a
 * livereg_reaper_life value to *state, and the reaper's boot token (new at
 * every start: two equal tokens are the same reaper) and pid (in its own
 * PID namespace) to *boot_token and *pid, 0 when absent (both may be NULL).
 * DYING is written from the very start of the reaper process's exit (the
 * kernel marks a word of the table's header that a thread of the reaper's
 * holds, before the process's memory and files are torn down), until the
 * kernel has finished (then ABSENT) or a new reaper serves. A reaper is
 * never DYING while its process runs (stopped, or a thread of it ended).
 * On a table made by an earlier library: SERVING or ABSENT only. */
livereg_result livereg_reaper_state(const livereg_table *table, uint32_t *state,
                                    uint64_t *boot_token, uint32_t *pid);

/* Blocks up to wait_ms until the reaper's state or boot token differs from
 * known_state and known_token (what the caller last saw, e.g. from
 * livereg_reaper_state), then writes the new state as livereg_reaper_state
 * does. No polling: the calling thread sleeps on a futex of the table's
 * header, which the kernel wakes as the reaper's process begins to die and
 * a reaper wakes as it starts or stops (within a millisecond of a SIGKILL
 * on an idle machine). Returns at once when the state already differs.
 * Errors: TIMEOUT (nothing changed within wait_ms; the outputs hold the
 * state, unchanged). Any thread may call it, several at once. */
livereg_result livereg_reaper_wait(const livereg_table *table, uint32_t known_state,
                                   uint64_t known_token, uint64_t wait_ms, uint32_t *state,
                                   uint64_t *boot_token, uint32_t *pid);

/* Publishes len bytes (at most 1024; data may be NULL when len is 0) in the
 * table's info area, replacing what was there: configuration workers read
 * with livereg_get_info, without RPC. Writers are serialised across
 * processes. Errors: INVALID_ARGUMENT (over 1024 bytes), INCOMPATIBLE (a
 * table of layout 1.0 or 1.1), BUSY. */
livereg_result livereg_set_info(const livereg_table *table, const void *data, size_t len);

/* Copies the published bytes (a consistent copy, never half-written) into
 * buf and their number into *len. If cap is too small, copies nothing, sets
 * *len to the size needed and returns INVALID_ARGUMENT. Errors: INCOMPATIBLE
 * (a table of layout 1.0 or 1.1), BUSY (a writer has not finished for 1 s). */
livereg_result livereg_get_info(const livereg_table *table, void *buf, size_t cap, size_t *len);

/* Writes the table's metrics in the OpenMetrics text format (ending in
 * "# EOF", every sample labelled table="NAME"; the names are in
 * docs/operations.md) and a terminating NUL into buf, and the text's length
 * (without the NUL) into *len: for a server that serves its own /metrics. If
 * cap is under *len + 1, writes nothing, sets *len and returns
 * INVALID_ARGUMENT: call once with buf NULL and cap 0 for the size. */
livereg_result livereg_metrics_text(const livereg_table *table, char *buf, size_t cap, size_t *len);

/* Fills *out with a snapshot of the table. */
livereg_result livereg_get_stats(const livereg_table *table, livereg_stats *out);
livereg_result livereg_get_stats_sized(const livereg_table *table, livereg_stats *out,
                                       size_t out_size);
#define livereg_get_stats(table, out) \
    livereg_get_stats_sized((table), (out), sizeof(livereg_stats))

/* A reaper is a handle that holds the table's reaper role for its whole life
 * (BUSY if another process, or another handle, holds it) and keeps one boot
 * token, one exit watcher and its memory of the slots. Drive it from your own
 * event loop (epoll, poll, asyncio):
 *
 *     livereg_reaper_acquire(table, &cb, &reaper);
 *     for (;;) {
 *         struct pollfd p = { livereg_reaper_fd(reaper), POLLIN, 0 };
 *         poll(&p, 1, (int)livereg_reaper_next_scan_ms(reaper));
 *         livereg_reaper_scan(reaper, NULL);   // callbacks run here
 *     }
 *
 * or let livereg_reaper_start scan on library threads. Either kind is freed
 * by livereg_reaper_stop. */

/* Takes the reaper role for a handle you drive. cb may be NULL; it is copied.
 * Errors: BUSY, IO. */
livereg_result livereg_reaper_acquire(const livereg_table *table, const livereg_callbacks *cb,
                                      livereg_reaper **out);
livereg_result livereg_reaper_acquire_sized(const livereg_table *table,
                                            const livereg_callbacks *cb, size_t cb_size,
                                            livereg_reaper **out);
#define livereg_reaper_acquire(table, cb, out) \
    livereg_reaper_acquire_sized((table), (cb), sizeof(livereg_callbacks), (out))

/* One scan now, on this thread: ends what went silent or whose process died,
 * runs the callbacks here, frees the slots. *ended (may be NULL) receives the
 * number of registrations ended. Errors: INVALID_ARGUMENT (NULL, or a reaper
 * from livereg_reaper_start), CORRUPT (the table was truncated), BUSY (called
 * from this reaper's own callback: the scan in progress is the one). */
livereg_result livereg_reaper_scan(const livereg_reaper *reaper, uint32_t *ended);

/* A descriptor that becomes readable when a scan is due early: a watched
 * process exited, a registration ended or was made, a clear was requested.
 * A scan consumes it; do not read or close it. -1 for NULL or a reaper from
 * livereg_reaper_start. */
int livereg_reaper_fd(const livereg_reaper *reaper);

/* Milliseconds (rounded up) until the next periodic scan is due: 0 before the
 * first scan (and from the reaper's own callback), never more than
 * reap_timeout/4. Use it as the poll timeout. */
uint64_t livereg_reaper_next_scan_ms(const livereg_reaper *reaper);

/* Takes the role, as livereg_reaper_acquire, and scans on library threads
 * every reap_timeout/4 and at once when woken; callbacks run on handler
 * threads (several at once when one is slow). cb may be NULL; it is copied.
 * With reaping disabled (timeout 0) no thread starts. Errors: BUSY, IO. */
livereg_result livereg_reaper_start(const livereg_table *table, const livereg_callbacks *cb,
                                    livereg_reaper **out);
livereg_result livereg_reaper_start_sized(const livereg_table *table,
                                          const livereg_callbacks *cb, size_t cb_size,
                                          livereg_reaper **out);
#define livereg_reaper_start(table, cb, out) \
    livereg_reaper_start_sized((table), (cb), sizeof(livereg_callbacks), (out))

/* Gives the role back and frees the handle (NULL ignored): for a reaper from
 * livereg_reaper_start, after its current scan and the callbacks it started
 * (called from one of its own callbacks, it returns at once and the reaper
 * stops once that callback returns). Called from a callback of a reaper from
 * livereg_reaper_acquire, inside its livereg_reaper_scan, it does nothing:
 * the handle stays valid, livereg_last_error says why; stop it after the scan
 * returns. */
void livereg_reaper_stop(livereg_reaper *reaper);

/* ---- Sessions: workers that cannot map the table ----------------------
 *
 * A worker in a container that shares no /dev/shm, IPC or PID namespace
 * with the reaper registers through the reaper's listener over a socket.
 * Addresses are "unix:/ABSOLUTE/PATH", "tcp://HOST:PORT" or "tls://HOST:PORT"
 * (an IPv4 address, [IPv6] or a DNS name; tls:// verifies the listener
 * against the CA in opts, never falling back to plaintext). The handle livereg_connect gives is an
 * ordinary livereg_worker: livereg_ping, livereg_set_busy, livereg_progress
 * and livereg_deregister work unchanged and cost the same (they write memory
 * this process maps; no system call). Over unix: with a listener of session
 * protocol 4, that memory is a region the listener shared (a sealed memfd),
 * which the reaper reads at its scans (judged then as a registration in its
 * table: never beaten, by the grace); otherwise a library thread forwards
 * them to the
 * reaper eight times per reap timeout. The thread delivers the reaper's
 * notices either way: when
 * the registration ends (evicted, reset, ...), the next ping returns
 * EVICTED. If the connection breaks, the thread reconnects with backoff and
 * takes the same registration back; if no listener takes it back within the
 * reap timeout, the next ping returns EVICTED: register again. The process
 * dying (or its connection being cut) ends the registration
 * LIVEREG_REASON_DISCONNECTED at once; over a shared region, the reaper's
 * on_dying hears it first, as the process begins to exit. */

typedef struct livereg_connect_options {
    const char *token;              /* the listener's token; required by tcp:// listeners; NULL: none */
    uint64_t connect_timeout_ms;    /* connection and answer; 0: the default (2000) */
    const char *tls_ca_file;        /* tls:// only (required there): the CA (PEM) the listener's certificate must chain to */
    const char *tls_cert_file;      /* for a listener requiring client certificates: this client's certificate (PEM) ... */
    const char *tls_key_file;       /* ... and its key (PEM); NULL: none */
} livereg_connect_options;

/* Fills *out with the defaults: no token, the default timeout. */
void livereg_connect_options_default(livereg_connect_options *out);
void livereg_connect_options_default_sized(livereg_connect_options *out, size_t size);
#define livereg_connect_options_default(out) \
    livereg_connect_options_default_sized((out), sizeof(livereg_connect_options))

/* Registers instance_id (label may be NULL) through the listener at address;
 * opts may be NULL (the defaults). Errors: INVALID_ARGUMENT (a bad address,
 * id 0, a bad label), EXISTS (the id is live, its holder is not disturbed),
 * PERMISSION (a wrong or missing token, a TLS handshake that failed: a
 * certificate that does not verify, a plaintext listener), FULL, BUSY (the
 * id's previous drop is pending), TIMEOUT (no answer in time), INCOMPATIBLE (not a livereg
 * listener), IO (the connection failed). */
livereg_result livereg_connect(const char *address, const livereg_connect_options *opts,
                               uint64_t instance_id, const char *label, livereg_worker **out);
livereg_result livereg_connect_sized(const char *address, const livereg_connect_options *opts,
                                     size_t opts_size, uint64_t instance_id, const char *label,
                                     livereg_worker **out);
#define livereg_connect(address, opts, instance_id, label, out) \
    livereg_connect_sized((address), (opts), sizeof(livereg_connect_options), (instance_id), \
                          (label), (out))

/* The server's info area (see livereg_get_info): read from the table for a
 * registered worker, as the listener last delivered it for a session. If cap
 * is too small, copies nothing, sets *len to the size needed and returns
 * INVALID_ARGUMENT. */
livereg_result livereg_worker_get_info(const livereg_worker *worker, void *buf, size_t cap,
                                       size_t *len);

/* Asks the server for a clear (see livereg_clear) from the engine holding
 * worker: on the table it registered in, or, for a session, through the
 * listener it connected to (over a connection of its own, with the same
 * token and TLS). Registrations are untouched; worker keeps beating. Waits
 * up to wait_ms for the clear handlers to return. Errors: as
 * livereg_clear (TIMEOUT, NO_REAPER), and for a session as livereg_connect
 * (PERMISSION, IO, ...). */
livereg_result livereg_worker_clear(const livereg_worker *worker, uint64_t wait_ms);

/* As livereg_worker_clear, a reset (see livereg_reset): every registration
 * of the server's table ends CLEARED, this one too (its next ping returns
 * EVICTED: register again). */
livereg_result livereg_worker_reset(const livereg_worker *worker, uint64_t wait_ms);

/* Serves sessions at address for the reaper's life (until
 * livereg_reaper_stop). token (NUL-terminated) is what clients must present;
 * required for tcp:// (INVALID_ARGUMENT without), may be NULL for unix:
 * (the socket is made mode 0660). Errors: INVALID_ARGUMENT, BUSY (another
 * listener serves that socket), IO (cannot bind). Not concurrently with
 * another call on the same reaper (call it where you call livereg_reaper_scan,
 * or right after livereg_reaper_start). */
livereg_result livereg_reaper_listen(livereg_reaper *reaper, const char *address,
                                     const char *token);

/* A static name for a result ("LIVEREG_OK", ...). Never NULL. */
const char *livereg_result_str(int r);

/* This thread's message for its last failure ("" if none). Valid until the
 * next failing call on this thread. Never NULL. */
const char *livereg_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* LIVEREG_H */
