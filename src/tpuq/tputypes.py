"""The TPU accelerator catalogue: family, chips and hosts of an accelerator type.

Pure data and arithmetic; every service, the CLI and the fake TPU API use it so
that "how many hosts does a v4-32 have" has exactly one answer.

Facts (see docs/ARCHITECTURE.md):
- v2, v3, v4 and v5p names count TensorCores (2 per chip); v5e (v5litepod) and
  v6e names count chips.
- v2/v3/v4/v5p hosts carry 4 chips. v5e/v6e single-host types (-1, -4, -8)
  have one host; multi-host slices carry 4 chips per host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TYPE_RE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")

# family -> (name counts cores?, default runtime version)
_FAMILIES: dict[str, tuple[bool, str]] = {
    "v2": (True, "tpu-ubuntu2204-base"),
    "v3": (True, "tpu-ubuntu2204-base"),
    "v4": (True, "tpu-ubuntu2204-base"),
    "v5p": (True, "v2-alpha-tpuv5"),
    "v5litepod": (False, "v2-alpha-tpuv5-lite"),
    "v6e": (False, "v2-alpha-tpuv6e"),
}

# Friendly aliases users write; the API only knows the canonical names.
_ALIASES = {"v5e": "v5litepod"}

# Hosts of 16 or more need internal IPs (external IP quota is 8 per region).
INTERNAL_IPS_FROM_HOSTS = 16


class UnknownAcceleratorType(ValueError):
    pass


@dataclass(frozen=True)
class AcceleratorType:
    name: str  # canonical API name, e.g. "v5litepod-64"
    family: str  # "v2" | "v3" | "v4" | "v5p" | "v5litepod" | "v6e"
    size: int  # the number in the name
    chips: int
    hosts: int
    default_runtime: str

    @property
    def needs_internal_ips(self) -> bool:
        return self.hosts >= INTERNAL_IPS_FROM_HOSTS

    @property
    def generation(self) -> str:
        """Generation label used in node acceleratorConfig.type (V4, V5LITE_POD, V6E...)."""
        return {
            "v2": "V2",
            "v3": "V3",
            "v4": "V4",
            "v5p": "V5P",
            "v5litepod": "V5LITE_POD",
            "v6e": "V6E",
        }[self.family]


def canonical_name(name: str) -> str:
    """`v5e-8` -> `v5litepod-8`; canonical names pass through unchanged."""
    family, _, size = name.strip().lower().partition("-")
    return f"{_ALIASES.get(family, family)}-{size}" if size else name.strip().lower()


def parse_accelerator_type(name: str) -> AcceleratorType:
    canon = canonical_name(name)
    m = _TYPE_RE.match(canon)
    if not m:
        raise UnknownAcceleratorType(
            f"unknown TPU type {name!r}: expected e.g. v4-32, v5litepod-64 (or v5e-64), v6e-8"
        )
    family, size = m.group(1), int(m.group(2))
    counts_cores, runtime = _FAMILIES[family]
    if size <= 0:
        raise UnknownAcceleratorType(f"unknown TPU type {name!r}: size must be positive")
    if counts_cores:
        if size % 8:
            raise UnknownAcceleratorType(
                f"unknown TPU type {name!r}: {family} sizes are multiples of 8 TensorCores"
            )
        chips = size // 2
        hosts = max(1, chips // 4)
    else:
        chips = size
        if size <= 8:
            if size not in (1, 4, 8):
                raise UnknownAcceleratorType(
                    f"unknown TPU type {name!r}: single-host {family} sizes are 1, 4 or 8"
                )
            hosts = 1
        else:
            if size % 4:
                raise UnknownAcceleratorType(
                    f"unknown TPU type {name!r}: multi-host {family} sizes are multiples of 4 chips"
                )
            hosts = size // 4
    return AcceleratorType(canon, family, size, chips, hosts, runtime)


def zone_region(zone: str) -> str:
    """`us-central2-b` -> `us-central2`."""
    region, sep, suffix = zone.rpartition("-")
    if not sep or not region or len(suffix) != 1:
        raise ValueError(f"not a zone name: {zone!r} (expected e.g. us-central2-b)")
    return region
