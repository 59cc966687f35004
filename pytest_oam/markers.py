"""``@pytest.mark.oam(...)``: the markers of a test (module, class, function) merged into one
:class:`MarkerSettings`, parsed once per test and kept in ``item.stash``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from .judge.thresholds import ThresholdError, parse_mapping
from .settings import check_hardware, usage_error

MARKER_KEY = pytest.StashKey["tuple[tuple[int, ...], MarkerSettings]"]()


MARKER_KEYWORDS = ("thresholds", "hardware", "devices", "tuned")


@dataclass(frozen=True)
class MarkerSettings:
    thresholds: dict[str, float]
    hardware: str | None
    devices: int | None
    #: ``tuned={"FlashAttention": "5%"}``: op type or glob -> fraction slower than the tuned optimum allowed.
    tuned: dict[str, float] = field(default_factory=dict)


def marker_settings(item: pytest.Item) -> MarkerSettings:
    """Settings of every ``@pytest.mark.oam`` of ``item``, merged.

    Markers of the module, the class and the function (and stacked markers) all apply; where
    two set the same key, the closer one wins, and ``thresholds`` and ``tuned`` merge pattern by
    pattern.

    Raises:
        pytest.UsageError: positional arguments, an unknown keyword, bad thresholds or tuned
            limits, an unknown hardware name, or a non-positive device count; the message
            names the test.
    """
    thresholds: dict[str, float] = {}
    tuned: dict[str, float] = {}
    hardware = devices = None
    where = f"{item.nodeid}: @pytest.mark.oam"
    for marker in reversed(list(item.iter_markers("oam"))):  # farthest first, closest last
        if marker.args:
            raise usage_error(f"{where}: takes keywords only ({', '.join(MARKER_KEYWORDS)}), got {marker.args!r}")
        unknown = sorted(set(marker.kwargs) - set(MARKER_KEYWORDS))
        if unknown:
            raise usage_error(f"{where}: unknown keyword {unknown[0]!r}; known: {', '.join(MARKER_KEYWORDS)}")
        try:
            thresholds.update(parse_mapping(marker.kwargs.get("thresholds") or {}))
            if "tuned" in marker.kwargs:
                tuned.update(parse_mapping(marker.kwargs["tuned"], "tuned"))
        except ThresholdError as exc:
            raise usage_error(f"{where}: {exc}") from None
        if marker.kwargs.get("hardware") is not None:
            hardware = marker.kwargs["hardware"]
            if not isinstance(hardware, str):
                raise usage_error(f"{where}: hardware must be a name, got {hardware!r}")
            hardware = check_hardware(hardware, where, item.path.parent)  # a file's path: beside the test file
        if marker.kwargs.get("devices") is not None:
            devices = marker.kwargs["devices"]
            if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
                raise usage_error(f"{where}: devices must be a positive integer, got {devices!r}")
    return MarkerSettings(thresholds, hardware, devices, tuned)



def marker_of(item: pytest.Item) -> MarkerSettings:
    """:func:`marker_settings` of ``item``, parsed once and kept in ``item.stash`` until its
    markers change (``request.applymarker`` or a hook may add one after collection: it applies).

    Raises:
        pytest.UsageError: see :func:`marker_settings`.
    """
    key = tuple(id(marker) for marker in item.iter_markers("oam"))
    cached = item.stash.get(MARKER_KEY, None)
    if cached is None or cached[0] != key:
        cached = item.stash[MARKER_KEY] = (key, marker_settings(item))
    return cached[1]


def uses_oam_profile(item: pytest.Item) -> bool:
    """Whether the test asks for the ``oam_profile`` fixture in its signature (or a fixture's)."""
    return "oam_profile" in getattr(item, "fixturenames", ())


def marker_is_ours(item: pytest.Item) -> bool:
    """Whether ``item``'s ``@pytest.mark.oam`` markers are pytest-oam's: the test uses the
    ``oam_profile`` fixture, or they parse as ours (:func:`marker_of`). Another suite's own
    ``oam`` marker (``@pytest.mark.oam("nightly")``, ``owner=...``) on a test without the
    fixture is not, and is left alone."""
    if uses_oam_profile(item):
        return True
    if item.get_closest_marker("oam") is None:
        return False
    try:
        marker_of(item)
    except pytest.UsageError:
        return False
    return True
