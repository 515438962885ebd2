"""Helpers for testing agent graphs, in mhsafeeval's own tests and in yours.

* :class:`ScriptedModel` / :func:`register_script`: a deterministic model, addressed as
  ``scripted/<name>`` like any provider, so tests inject at the provider seam.
* :class:`Recorder`: an observer that keeps every message it sees, for assertions.
* ``scripted/demo-*``: scripted personas for every agent role, registered with the scripted
  provider, so a whole campaign runs in seconds without a model; :func:`scripted_models`
  writes their config tables.
"""

from mhsafeeval.runtime.providers._demo import (
    DEMO_SLIP_RATES,
    HARMS,
    demo_counselor,
    scripted_models,
)
from mhsafeeval.runtime.providers._scripted import (
    Reply,
    Script,
    ScriptedModel,
    ScriptExhausted,
    register_demo_scripts,
    register_script,
)

from ._recorder import Recorder

__all__ = [
    "DEMO_SLIP_RATES",
    "HARMS",
    "Recorder",
    "Reply",
    "Script",
    "ScriptExhausted",
    "ScriptedModel",
    "demo_counselor",
    "register_demo_scripts",
    "register_script",
    "scripted_models",
]
