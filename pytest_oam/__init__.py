"""pytest-oam: a performance regression gate for AI workloads on a simulated Ascend 910.

Importing this package is cheap: the pytest plugin (``pytest_oam.plugin``) autoloads in every
pytest run, so numpy, pydantic models and the simulator load only when a test profiles, or
when the Python API (:mod:`pytest_oam.api`) is first used.
"""

__version__ = "0.1.0"

_API = ("ProfileBaseline", "collect_profile", "compare_profiles", "parse_hardware", "known_models", "load_any",
        "save_profile", "load_profile")
_TUNE = ("OptimizationTarget", "ParameterSpace", "auto_tune")
_KNOWLEDGE_BASE = ("KnowledgeBase", "KnowledgeBaseError", "TunedGateFailure", "assert_near_tuned")
__all__ = [  # noqa: RUF022 - the API first, then tuning, then the tuned-results knowledge base
    "ProfileBaseline", "collect_profile", "compare_profiles", "parse_hardware", "known_models", "load_any",
    "save_profile", "load_profile",
    "OptimizationTarget", "ParameterSpace", "auto_tune",
    "KnowledgeBase", "KnowledgeBaseError", "TunedGateFailure", "assert_near_tuned",
]


def __getattr__(name: str):
    if name in _API:
        from . import api

        return getattr(api, name)
    if name in _TUNE:
        from .tuning import search

        return getattr(search, name)
    if name in _KNOWLEDGE_BASE:
        from .tuning import knowledge_base

        return getattr(knowledge_base, name)
    raise AttributeError(f"module 'pytest_oam' has no attribute {name!r}")
