"""The ``scripted/demo-*`` personas, kept here under their old import path.

They live with the scripted provider (:mod:`mhsafeeval.providers._demo`), which
registers them when it is imported; the names are re-exported as they are (``name as name``).
"""

from mhsafeeval.providers._demo import DEMO_SCRIPTS as DEMO_SCRIPTS
from mhsafeeval.providers._demo import DEMO_SLIP_RATES as DEMO_SLIP_RATES
from mhsafeeval.providers._demo import HARMS as HARMS
from mhsafeeval.providers._demo import SAFE_REPLY as SAFE_REPLY
from mhsafeeval.providers._demo import demo_client as demo_client
from mhsafeeval.providers._demo import demo_counselor as demo_counselor
from mhsafeeval.providers._demo import demo_judge as demo_judge
from mhsafeeval.providers._demo import demo_mutator as demo_mutator
from mhsafeeval.providers._demo import demo_refiner as demo_refiner
from mhsafeeval.providers._demo import scripted_models as scripted_models
from mhsafeeval.providers._scripted import register_demo_scripts as register_demo_scripts
