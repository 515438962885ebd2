"""The ``scripted/demo-*`` personas, kept here under their old import path.

They live with the scripted provider (:mod:`mhsafeeval.runtime.providers._demo`), which
registers them when it is imported.
"""

from mhsafeeval.runtime.providers._demo import (
    DEMO_SCRIPTS,
    DEMO_SLIP_RATES,
    HARMS,
    SAFE_REPLY,
    demo_client,
    demo_counselor,
    demo_judge,
    demo_mutator,
    demo_refiner,
    scripted_models,
)
from mhsafeeval.runtime.providers._scripted import register_demo_scripts

__all__ = [
    "DEMO_SCRIPTS",
    "DEMO_SLIP_RATES",
    "HARMS",
    "SAFE_REPLY",
    "demo_client",
    "demo_counselor",
    "demo_judge",
    "demo_mutator",
    "demo_refiner",
    "register_demo_scripts",
    "scripted_models",
]
