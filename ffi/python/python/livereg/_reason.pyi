import enum

class Reason(enum.IntEnum):
    """Why a registration ended (the stub of the list the native module makes)."""

    TIMEOUT = 1
    GRACE = 2
    PROCESS_EXITED = 3
    DEREGISTERED = 4
    CLEARED = 5
    REPLACED = 6
    STALLED = 7
    DISCONNECTED = 8
