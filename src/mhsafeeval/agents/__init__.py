"""The conversation agents: client simulator, counselor (the model under test), refiner, mutator.

Each agent is one instance per conversation (register it with ``scope="conversation"``, the
default), folds ``TurnCommitted`` events into its transcript, and builds prompts from committed
turns only. Every model call that finally fails becomes a ``CallFailed`` event and nothing else.
Prompt texts are package data (``prompts/*.txt``).

One turn, as the agents see it::

    Directive -> MutatorAgent -> Instruction -> ClientAgent -> ClientUtterance
    -> CounselorAgent -> CounselorReply -> (judge) -> Verdict -> RefinerAgent -> RefinerNotes

Example:
    >>> from mhsafeeval.runtime import Runtime
    >>> from mhsafeeval.runtime.providers import ModelClient
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

from ._client import ClientAgent, clean_utterance
from ._counselor import DEFAULT_COUNSELOR_PROMPT, CounselorAgent
from ._mutator import INSTRUCTION_SCHEMA, MutatorAgent, applied_operator
from ._prompts import call_seed
from ._refiner import NOTES_SCHEMA, RefinerAgent
from .profiles import (
    ClientProfile,
    CognitiveModel,
    builtin_profiles,
    load_profiles,
    profile_from_mapping,
    profile_to_text,
)

__all__ = [
    "DEFAULT_COUNSELOR_PROMPT",
    "INSTRUCTION_SCHEMA",
    "NOTES_SCHEMA",
    "ClientAgent",
    "ClientProfile",
    "CognitiveModel",
    "CounselorAgent",
    "MutatorAgent",
    "RefinerAgent",
    "applied_operator",
    "builtin_profiles",
    "call_seed",
    "clean_utterance",
    "load_profiles",
    "profile_from_mapping",
    "profile_to_text",
]
