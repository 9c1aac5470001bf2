//! The atomics facade: `std` atomics in the shipped build, `loom`'s under
//! `cfg(loom)`, so the slot protocol that runs in shared memory is the same code
//! that the model checker explores.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
