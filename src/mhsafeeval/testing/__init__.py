"""Helpers for testing agent graphs, in mhsafeeval's own tests and in yours.

* :class:`ScriptedModel` / :func:`register_script`: a deterministic model, addressed as
  ``scripted/<name>`` like any provider, so tests inject at the provider seam.
* :class:`Recorder`: an observer that keeps every message it sees, for assertions.
"""

from mhsafeeval.runtime.providers._scripted import (
    Reply,
    Script,
    ScriptedModel,
    ScriptExhausted,
    register_script,
)

from ._recorder import Recorder

__all__ = ["Recorder", "Reply", "Script", "ScriptExhausted", "ScriptedModel", "register_script"]
