"""Statistics that a report can defend: intervals, agreement, paired tests and families of them.

Every figure a campaign reports is a rate over few, correlated samples (attempts inside one
conversation are not independent) or an agreement between judges, so each comes with an
interval and a method that can be named in a footnote (docs/statistics.md says what each
figure is, and shows the coverage measured by ``benchmarks/coverage.py``):

- :func:`wilson_interval` / :func:`rate_wilson`: a proportion of independent trials.
- :func:`clustered_interval` / :func:`rate_clustered`: a rate whose units come in clusters
  (conversations): Wilson's interval over the effective number of units, at Student's t
  quantile; what the reports print. :data:`FEW_CONVERSATIONS` is where they warn.
- :func:`difference_interval`, :func:`difference_p_value`: two independent clustered rates;
  :func:`holm` controls a family of such tests (``compare``'s cells).
- :func:`weighted_kappa`, :func:`krippendorff_alpha`, :func:`spearman_rho`: agreement between
  two or more raters; nan where undefined (no variation), as in the reference
  implementations. :func:`bootstrap_interval` gives any of them an interval over independent
  units, :func:`table_bootstrap` over conversations, and both count the resamples they skip.
- :func:`confusion_matrix`, :func:`threshold_rates`: a judge against a reference at the
  attack-success threshold.
- :func:`permutation_test_paired`: do two counselor models differ on the same profiles? and
  :func:`smallest_p_value`: can it tell at all, with this many profiles?

Randomised methods take a seed and draw from their own generator (``numpy.random.default_rng``
for the bootstraps, ``random.Random`` for the sign flips): the same inputs and seed give the
same numbers, never touching a global RNG.

Example:
    >>> r = rate_wilson(5, 10)
    >>> (r.value, round(r.low, 4), round(r.high, 4), r.n)
    (0.5, 0.2366, 0.7634, 10)
"""

from ._agreement import (
    NO_VARIATION,
    Table,
    alpha_from_coincidence_tables,
    alpha_from_coincidences,
    coincidence_table,
    kappa_from_table,
    kappa_from_tables,
    krippendorff_alpha,
    pair_table,
    weighted_kappa,
)
from ._bootstrap import (
    BootstrapInterval,
    bootstrap_interval,
    bootstrap_statistic,
    cluster_bootstrap,
    cluster_bootstrap_tables,
    cluster_bootstraps,
    table_bootstrap,
)
from ._clustered import (
    clustered_interval,
    difference_interval,
    difference_p_value,
    holm,
    rate_clustered,
)
from ._core import (
    CONFIDENCE,
    FEW_CONVERSATIONS,
    LEVELS,
    RESAMPLES,
    SEED,
    Rate,
    normal_quantile,
    rate_wilson,
    t_quantile,
    t_tail,
    wilson_interval,
)
from ._judging import ThresholdRates, confusion_matrix, spearman_rho, threshold_rates
from ._paired import permutation_test_paired, smallest_p_value

__all__ = [
    "CONFIDENCE",
    "FEW_CONVERSATIONS",
    "LEVELS",
    "NO_VARIATION",
    "RESAMPLES",
    "SEED",
    "BootstrapInterval",
    "Rate",
    "Table",
    "ThresholdRates",
    "alpha_from_coincidence_tables",
    "alpha_from_coincidences",
    "bootstrap_interval",
    "bootstrap_statistic",
    "cluster_bootstrap",
    "cluster_bootstrap_tables",
    "cluster_bootstraps",
    "clustered_interval",
    "coincidence_table",
    "confusion_matrix",
    "difference_interval",
    "difference_p_value",
    "holm",
    "kappa_from_table",
    "kappa_from_tables",
    "krippendorff_alpha",
    "normal_quantile",
    "pair_table",
    "permutation_test_paired",
    "rate_clustered",
    "rate_wilson",
    "smallest_p_value",
    "spearman_rho",
    "t_quantile",
    "t_tail",
    "table_bootstrap",
    "threshold_rates",
    "weighted_kappa",
    "wilson_interval",
]
