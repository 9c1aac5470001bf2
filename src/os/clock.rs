//! The clock system calls: `clock_gettime` (a vDSO read, no system call)
//! and `clock_getres`, read in nanoseconds or in the rounded-up
//! microseconds a beat word holds.

/// `clock_gettime(CLOCK_MONOTONIC)` in nanoseconds: a vDSO read, no system call.
#[inline]
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// `clock_gettime(CLOCK_MONOTONIC_COARSE)` in nanoseconds: the time at the
/// kernel's last tick, a vDSO read without the hardware counter, so several
/// times cheaper than [`monotonic_ns`] and up to
/// [`coarse_resolution_ns`] behind it.
#[inline]
pub fn monotonic_coarse_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

/// `clock_gettime(clock)` in nanoseconds.
#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    nanos(&timespec(clock))
}

/// A `timespec` in nanoseconds.
#[inline]
fn nanos(ts: &libc::timespec) -> u64 {
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `clock_gettime(CLOCK_MONOTONIC)` in microseconds, rounded up.
#[inline]
pub(crate) fn monotonic_micros() -> u64 {
    micros_ceil(&timespec(libc::CLOCK_MONOTONIC))
}

/// `clock_gettime(CLOCK_MONOTONIC_COARSE)` in microseconds, rounded up.
#[inline]
pub(crate) fn monotonic_coarse_micros() -> u64 {
    micros_ceil(&timespec(libc::CLOCK_MONOTONIC_COARSE))
}

/// A `timespec` in microseconds, rounded up; `tv_nsec` is below 10^9, so
/// its part is 32-bit arithmetic.
#[inline]
fn micros_ceil(ts: &libc::timespec) -> u64 {
    ts.tv_sec as u64 * 1_000_000 + u64::from((ts.tv_nsec as u32).div_ceil(1_000))
}

#[inline]
fn timespec(clock: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY:
    // - `ts` is a valid, writable `timespec` for the duration of the call.
    // - both clocks read here exist on every Linux since 2.6.32, so the call
    //   cannot fail; were it to, `ts` keeps its zero value and we return 0
    //   (a stamp in the past: a registration looks older, never younger).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts
}

/// How far `CLOCK_MONOTONIC_COARSE` may lag `CLOCK_MONOTONIC`: its
/// resolution (`clock_getres`), the kernel's tick (4 ms at `HZ=250`).
pub fn coarse_resolution_ns() -> u64 {
    // Miri cannot call `clock_getres`; the heap-backed tests it runs see the
    // tick of a common kernel instead.
    if cfg!(miri) {
        return 4_000_000;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY:
    // - `ts` is a valid, writable `timespec` for the duration of the call;
    //   on failure (never on Linux) it stays zero, and a zero resolution
    //   makes a new table stamp precisely.
    unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    nanos(&ts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microseconds_from_a_timespec_round_up_as_from_nanoseconds() {
        for (sec, nsec) in [
            (0, 0),
            (0, 1),
            (0, 999),
            (0, 1_000),
            (0, 1_001),
            (7, 999_999_999),
            (1 << 30, 123_456_789),
        ] {
            let ts = libc::timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            };
            let ns = sec as u64 * 1_000_000_000 + nsec as u64;
            assert_eq!(micros_ceil(&ts), ns.div_ceil(1_000), "{sec} s {nsec} ns");
        }
    }
}
