"""Sampling: greedy argmax today; top-k / top-p / min-p, penalties and speculative verification next.
The family's public names are ``api.__all__``: an op added there is exported by kernelset as it is."""
from . import api
from .api import *  # noqa: F401,F403

__all__ = list(api.__all__)
