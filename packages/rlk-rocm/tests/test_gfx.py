"""Target IDs: parsing, KFD version numbers, and which code object runs on which device."""

from __future__ import annotations

import pytest

from rlk_rocm import gfx


def test_parse_processor_and_features() -> None:
    target = gfx.parse("gfx90a:sramecc+:xnack-")
    assert target.processor == "gfx90a"
    assert target.features == {"sramecc": True, "xnack": False}
    assert str(target) == "gfx90a:sramecc+:xnack-"
    assert gfx.parse(" gfx1100 ").features == {}
    assert gfx.parse("gfx11-generic").processor == "gfx11-generic"


@pytest.mark.parametrize("bad", ["sm_90", "gfx", "gfx90a:xnack", "90a", "gfx90a;gfx942", ""])
def test_parse_rejects_what_is_not_a_target(bad: str) -> None:
    with pytest.raises(ValueError, match="unrecognised AMD GPU target"):
        gfx.parse(bad)


def test_unknown_generic_target_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown generic AMD GPU target 'gfx8-generic'.*gfx11"):
        gfx.parse("gfx8-generic")


@pytest.mark.parametrize(
    ("version", "name"),
    [
        (90010, "gfx90a"),
        (90402, "gfx942"),
        (90400, "gfx940"),
        (90500, "gfx950"),
        (90012, "gfx90c"),
        (110000, "gfx1100"),
        (100300, "gfx1030"),
        (120001, "gfx1201"),
        (90008, "gfx908"),
    ],
)
def test_name_from_kfd_version(version: int, name: str) -> None:
    assert gfx.name_from_version(version) == name


@pytest.mark.parametrize("version", [0, -1, 91600, 90016])
def test_bad_kfd_version(version: int) -> None:
    with pytest.raises(ValueError, match="not a gfx_target_version"):
        gfx.name_from_version(version)


@pytest.mark.parametrize(
    ("built", "device", "runs"),
    [
        ("gfx90a", "gfx90a", True),
        ("gfx90a", "gfx90a:sramecc+:xnack-", True),  # an unset feature runs in either mode
        ("gfx90a", "gfx942", False),  # no forward compatibility between processors
        ("gfx940", "gfx942", False),
        ("gfx90a:xnack+", "gfx90a:sramecc+:xnack+", True),
        ("gfx90a:xnack+", "gfx90a:sramecc+:xnack-", False),
        ("gfx90a:xnack-", "gfx90a", None),  # the device's mode is not known
        ("gfx9-4-generic", "gfx942:sramecc+:xnack-", True),
        ("gfx9-4-generic", "gfx90a", False),
        ("gfx11-generic", "gfx1151", True),
        ("gfx11-generic", "gfx1030", False),
    ],
)
def test_runs_on(built: str, device: str, runs: bool | None) -> None:
    assert gfx.runs_on(built, device) is runs


@pytest.mark.parametrize(
    ("built", "device", "expected"),
    [
        (["gfx90a", "gfx942"], "gfx942:sramecc+:xnack-", None),
        (["gfx90a", "gfx942"], "gfx90a", None),
        (["gfx90a", "gfx940"], "gfx1100", "built for gfx90a;gfx940, device is gfx1100"),
        (["gfx90a", "gfx942"], "gfx950", "built for gfx90a;gfx942, device is gfx950"),
        (["gfx90a:xnack-"], "gfx90a:xnack+", "built for gfx90a:xnack-, device is gfx90a:xnack+"),
        (["gfx90a:xnack-"], "gfx90a", "built for gfx90a:xnack-, device is gfx90a"),
    ],
)
def test_arch_mismatch(built: list[str], device: str, expected: str | None) -> None:
    assert gfx.arch_mismatch(built, device) == expected


def test_undecided_only_when_a_feature_mode_is_missing() -> None:
    assert gfx.undecided(["gfx90a:xnack-"], "gfx90a")
    assert not gfx.undecided(["gfx90a:xnack-"], "gfx90a:xnack-")
    assert not gfx.undecided(["gfx90a:xnack-", "gfx90a"], "gfx90a")  # plain gfx90a surely runs
    assert not gfx.undecided(["gfx942:xnack-"], "gfx90a")  # another processor: surely not
