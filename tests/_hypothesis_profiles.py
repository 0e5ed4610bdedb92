"""Hypothesis profiles for the property tests (tests/test_properties.py).

- ``ci`` (the default): bounded example counts (each test sets its own, see the comment
  block at the top of test_properties.py) so the whole property module runs well under a
  minute on two cores; ``derandomize=True`` makes every run try the same examples, so CI
  is deterministic; no deadline (a simulation's wall time varies with the machine).
- ``fuzz`` (``make fuzz``, ``HYPOTHESIS_PROFILE=fuzz``): random seeds and many more
  examples per test (``FUZZ_EXAMPLES``), for a longer hunt by hand.

The profile is picked with the ``HYPOTHESIS_PROFILE`` environment variable. Importing this
module registers and loads the profiles; it does not touch tests/conftest.py.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES = 1000
"""Examples per test under the ``fuzz`` profile (tests scale it with ``examples()``)."""

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "fuzz",
    max_examples=FUZZ_EXAMPLES,
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "fuzz"):
    raise ValueError(f"HYPOTHESIS_PROFILE: got {PROFILE!r}; allowed: ci, fuzz")
settings.load_profile(PROFILE)


def examples(ci: int, fuzz: int = FUZZ_EXAMPLES) -> settings:
    """A ``@settings`` decorator running ``ci`` examples under the ci profile and ``fuzz``
    under the fuzz profile (the other settings come from the loaded profile)."""
    return settings(max_examples=fuzz if PROFILE == "fuzz" else ci)
