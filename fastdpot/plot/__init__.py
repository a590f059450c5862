"""Pictures of a user's own objects: particles against data, ε against steps, an audit against its claims.

matplotlib is an optional extra (``pip install 'fastdpot[plot]'``): ``import fastdpot`` and ``import fastdpot.plot``
never import it; the first picture does, and says how to install it when it is missing. Every function draws into
``ax`` (a new figure when None), returns the ``matplotlib.axes.Axes``, and with ``path`` also saves the figure there
and closes it.

* :func:`particles`: particles (a flow, or any (N, d) rows) and data, projected on two chosen directions;
* :func:`epsilon`: ε against the number of releases of a :class:`~fastdpot.privacy.PrivacyAccountant`, a
  :class:`~fastdpot.privacy.PrivacyLedger`, a :class:`~fastdpot.privacy.composition.ComposedLedger`, a flow or a
  :class:`~fastdpot.DPSlicedWassersteinLoss` built by ``from_privacy`` (the numbers: :func:`epsilon_curve`);
* :func:`audit`: the audit's empirical lower bounds on ε against the claimed ε (:mod:`fastdpot.audit`).

A picture of private data (the data, or particles that have not been released) is not private: it is for the data
holder. The particles of a private flow are a release (post-processing of its noisy releases).
"""
from __future__ import annotations

from ._audit import audit
from ._epsilon import epsilon, epsilon_curve, epsilon_stages
from ._particles import particles
from ._release import quantiles

__all__ = ["particles", "epsilon", "epsilon_curve", "epsilon_stages", "quantiles", "audit"]
