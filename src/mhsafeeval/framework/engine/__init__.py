"""The engine: runs any agent graph as a campaign that can be stopped and resumed.

A :class:`Graph` declares a run: its agents (:class:`Node`), one start message per
conversation, how many run at once, and what the run stores. :func:`run_graph` runs it on a
:class:`~mhsafeeval.framework.Runtime` with an event store and gives every graph what makes a
campaign trustworthy:

* **resume**: a rerun against the same store streams the stored messages into the agents and
  does again only the work that was in flight (nothing stored is asked twice), holding the work
  left and a compact index of the finished conversations, never the whole stored campaign;
* **the scheduler**: ``concurrency`` conversations at a time, each ending with one
  ``ConversationFinished``;
* **limits** (anything with ``stop``, ``reached``, ``drained()`` and ``spent()``, e.g. the
  ``[budget]``): calls stop starting, those in flight finish and are stored;
* **the failure policy**: a handler that raises fails its conversation only; a conversation
  nothing moves any more is closed as ``stalled``; a rerun retries failed and stalled
  conversations from where they stopped; the run's end is always recorded.

The MHSafeEval campaign (:func:`mhsafeeval.campaign.run_campaign`) is one graph on it;
``examples/custom_graph.py`` is another.
"""

from ._graph import Graph, Intercept, Node, RunResult, Service
from ._run import resume_services, run_graph
from ._stored import Stored, load_stored, stored_messages

__all__ = [
    "Graph",
    "Intercept",
    "Node",
    "RunResult",
    "Service",
    "Stored",
    "load_stored",
    "resume_services",
    "run_graph",
    "stored_messages",
]
