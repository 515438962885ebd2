"""Campaigns on a Ray cluster: ``mhsafeeval run CONFIG --ray [ADDRESS|local]``.

The driver (:func:`run_distributed`, in the ``mhsafeeval run`` process) does what a plain run
does before its graph runs (:func:`~mhsafeeval.campaign.prepare_campaign`: the plan, the check
of the stored configuration, the stored part's index, the budget), then shards the open
conversations over worker actors (:class:`ShardWorker`). Each worker runs the ordinary engine
and agents on its conversations, with its own search controller, and queues what it would
store; the driver pulls those messages in batches and is the only writer of the store, in each
worker's order, so the store holds, per conversation, a prefix of what happened: what a resumed
run needs. A lost worker is replaced by one that resumes its open conversations from the store.

Shared by all workers, each as one actor: the budget (:class:`BudgetLedger`: every model call
is reserved there first, exact for counselor calls) and the harm archives
(:class:`ArchiveHub`: the best elite per counselor model and cell, which every worker's
controller takes in without publishing it again, and UCT's learned rates, summed over the
other shards). The refiner's notes stay per worker.

Ray is an optional dependency (``pip install 'mhsafeeval[ray]'``), imported only when a run
connects.
"""

from ._driver import connect, run_distributed
from ._shared import ArchiveHub, BudgetLedger
from ._worker import RemoteBudget, ShardStore, ShardWorker

__all__ = [
    "ArchiveHub",
    "BudgetLedger",
    "RemoteBudget",
    "ShardStore",
    "ShardWorker",
    "connect",
    "run_distributed",
]
