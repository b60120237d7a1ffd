"""reconstruct: items that quote the stored rows answering a query (spec associations-and-reconstruct §8).

One module per stage: :mod:`request` (stage 0), :mod:`cues` and :mod:`pool`
(stage 1), :mod:`bundle` (2), :mod:`walk` (3), :mod:`structure` (4),
:mod:`quote` (5), :mod:`budget` (6), :mod:`shape` and :mod:`tokens` (7);
:mod:`service` runs them in order. The time cue (``services.time_cue``,
``services.cue_arm``) is recall's, shared with recall.
"""

from cpersona.services.reconstruct.service import reconstruct

__all__ = ["reconstruct"]
