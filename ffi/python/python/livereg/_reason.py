"""Why a registration ended: ``livereg.Reason``, made from the core crate's
one list of reasons (the values of the C ABI's ``livereg_reason``)."""

import enum

from livereg._native import _REASONS

__all__ = ["Reason"]

Reason = enum.IntEnum("Reason", _REASONS, module="livereg")  # type: ignore[misc]
Reason.__doc__ = "Why a registration ended."
