"""The conversation agents: client simulator, counselor (the model under test), refiner, mutator.

Each agent is one instance per conversation (register it with ``scope="conversation"``, the
default), folds ``TurnCommitted`` events into its transcript, and builds prompts from committed
turns only. Every model call that finally fails becomes a ``CallFailed`` event and nothing else.
Prompt texts are package data (``prompts/*.txt``).

One turn, as the agents see it::

    Directive -> MutatorAgent -> Instruction -> ClientAgent -> ClientUtterance
    -> CounselorAgent -> CounselorReply -> (judge) -> Verdict -> RefinerAgent -> RefinerNotes

Example:
    >>> from mhsafeeval.framework import Runtime
    >>> from mhsafeeval.providers import ModelClient
    >>> from mhsafeeval.taxonomy import Taxonomy
    >>> def wire(rt: Runtime, counselor: ModelClient, helper: ModelClient,
    ...          taxonomy: Taxonomy, profile: ClientProfile) -> None:
    ...     rt.register("mutator", lambda aid: MutatorAgent(helper, taxonomy, profile),
    ...                 types=MutatorAgent.handled_types())
    ...     rt.register("client", lambda aid: ClientAgent(helper, profile),
    ...                 types=ClientAgent.handled_types())
    ...     rt.register("counselor", lambda aid: CounselorAgent(counselor),
    ...                 types=CounselorAgent.handled_types())
    ...     rt.register("refiner", lambda aid: RefinerAgent(helper),
    ...                 types=RefinerAgent.handled_types())
"""

from ._client import ClientAgent
from ._counselor import DEFAULT_COUNSELOR_PROMPT, CounselorAgent
from ._mutator import MutatorAgent
from ._refiner import RefinerAgent
from .profiles import ClientProfile, builtin_profiles, load_profiles

__all__ = [
    "DEFAULT_COUNSELOR_PROMPT",
    "ClientAgent",
    "ClientProfile",
    "CounselorAgent",
    "MutatorAgent",
    "RefinerAgent",
    "builtin_profiles",
    "load_profiles",
]
