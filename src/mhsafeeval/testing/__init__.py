"""Helpers for testing agent graphs, in mhsafeeval's own tests and in yours.

* :func:`register_script`: a deterministic model (a
  :class:`~mhsafeeval.providers.ScriptedModel`), addressed as
  ``scripted/<name>`` like any provider, so tests inject at the provider seam.
* :class:`Recorder`: an observer that keeps every message it sees, for assertions.
* ``scripted/demo-*``: scripted personas for every agent role, registered with the scripted
  provider, so a whole campaign runs in seconds without a model; :func:`scripted_models`
  writes their config tables.
"""

from mhsafeeval.providers import register_script

from ._demo import HARMS, demo_client, demo_counselor, demo_judge, demo_mutator, scripted_models
from ._recorder import Recorder

__all__ = [
    "HARMS",
    "Recorder",
    "demo_client",
    "demo_counselor",
    "demo_judge",
    "demo_mutator",
    "register_script",
    "scripted_models",
]
