"""Why a registration ended: the values of the C ABI's ``livereg_reason``."""

import enum


class Reason(enum.IntEnum):
    """Why a registration ended."""

    TIMEOUT = 1
    """Silent for the reap timeout after beating at least once."""
    GRACE = 2
    """Registered and never beat within the registration grace."""
    PROCESS_EXITED = 3
    """Its process died (seen through a pidfd or the kernel-held slot lock)."""
    DEREGISTERED = 4
    """Ended by its worker."""
    CLEARED = 5
    """Ended by a clear of the whole table."""
    REPLACED = 6
    """Replaced by a new registration of the same id."""
    STALLED = 7
    """Busy, beating, but making no progress for the progress timeout."""
