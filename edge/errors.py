"""The project's exceptions, one root for all of them.

::

    CocoError
    ├── SpecError (ValueError)          a MechanismSpec that cannot exist
    ├── InputError (ValueError)         data that is not in a mechanism's or encoder's domain
    └── ReportError (ValueError)        a report or state that does not fit the spec
          ├── .reason                   a short, bounded label (used as a metric label)

Library code raises these; the CLI turns them into one-line messages.
"""

from __future__ import annotations


class CocoError(Exception):
    """Root of every error this project raises on purpose."""


class SpecError(CocoError, ValueError):
    """Invalid mechanism parameters."""


class InputError(CocoError, ValueError):
    """An input vector or sensor reading outside the domain it must be in."""


class ReportError(CocoError, ValueError):
    """A report (or aggregate state) inconsistent with the spec.

    ``reason`` is one of a small fixed set of labels so that it can count rejections.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
