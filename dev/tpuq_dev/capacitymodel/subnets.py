"""The project's VPC subnets, as the fake's Compute Engine reports them and its TPU API enforces them.

Subnets are regional (tpuq.capacity.subnets): a TPU node's `networkConfig.subnetwork` must name a subnet in the node's
region (Cloud TPU, "Configure networking and access": "The subnetwork must be in the same region as the zone where
the TPU runs"). An auto-mode network has a subnet of its own name in every region, with a range of 10.128.0.0/9; a
custom-mode network has only the subnets its owner created. The scenario's `network.auto_mode_networks` and
`network.subnetworks` say which, for every project; `set_layout` replaces them for one project (`/_fake/subnetworks`).

No HTTP here: the fake's compute stand-in (tpuq_dev.faketpu.googleapis) renders what `find` and `in_region` return,
and the world calls `check_create` on every CreateQueuedResource.
"""

from __future__ import annotations

import re
import threading
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, field_validator

from tpuq.contracts.tputypes import zone_region

from .errors import ApiError, subnetwork_error

if TYPE_CHECKING:
    from .scenario import Scenario

_REGION_RE = re.compile(r"[a-z]+-[a-z]+\d+")
_RESOURCE_NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")  # Compute Engine resource names (RFC 1035)


class Subnetwork(BaseModel):
    """A subnet of a custom-mode VPC network, in compute v1's field names: what the fake's compute `subnetworks.get`
    and `.list` report, and what a TPU create's `networkConfig.subnetwork` must name in the node's region."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    region: str
    network: str = "default"
    ipCidrRange: str = "10.0.0.0/20"
    privateIpGoogleAccess: bool = False

    @field_validator("name", "network")
    @classmethod
    def _names(cls, value: str) -> str:
        if not _RESOURCE_NAME_RE.fullmatch(value):
            raise ValueError(f"not a Compute Engine resource name: {value!r}")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION_RE.fullmatch(value):
            raise ValueError(f"not a region name: {value!r} (expected e.g. us-central2)")
        return value


# The forms Cloud TPU accepts for networkConfig.subnetwork ("Configure networking and access"): a URL or path ending
# in regions/R/subnetworks/S, or the bare name S (then the node's region is meant).
_SUBNET_REF = re.compile(r"(?:^|/)regions/([^/]+)/subnetworks/([^/]+)$")


@dataclass(frozen=True)
class Layout:
    auto_mode_networks: tuple[str, ...]
    subnetworks: tuple[Subnetwork, ...]


def auto_mode_range(region: str) -> str:
    """A /20 of 10.128.0.0/9 for an auto-mode subnet, one per region (Google's own table is not reproduced)."""
    block = zlib.crc32(region.encode()) % 2048
    return f"10.{128 + block // 16}.{(block % 16) * 16}.0/20"


def _short(ref: str) -> str:
    return ref.rstrip("/").rsplit("/", 1)[-1]


class Subnets:
    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self._layouts: dict[str, Layout] = {}  # project -> its layout, set by set_layout
        self._unreadable: set[str] = set()  # projects whose subnets a caller may not read (403)
        self._lock = threading.Lock()

    def layout(self, project: str) -> Layout:
        with self._lock:
            if project in self._layouts:
                return self._layouts[project]
        network = self.scenario.network
        return Layout(tuple(network.auto_mode_networks), tuple(network.subnetworks))

    def set_layout(self, project: str, auto_mode_networks: list[str] | None, subnetworks: list[Subnetwork] | None,
                   permission_denied: bool = False) -> None:
        """Replace one project's subnets (None for both: back to the scenario's); permission_denied: its reads 403."""
        with self._lock:
            if auto_mode_networks is None and subnetworks is None:
                self._layouts.pop(project, None)
            else:
                scenario = self.scenario.network
                self._layouts[project] = Layout(
                    tuple(scenario.auto_mode_networks if auto_mode_networks is None else auto_mode_networks),
                    tuple(scenario.subnetworks if subnetworks is None else subnetworks))
            (self._unreadable.add if permission_denied else self._unreadable.discard)(project)

    def check_read(self, project: str, permission: str, resource: str) -> None:
        """Compute Engine's refusal of a caller without the permission."""
        with self._lock:
            if project in self._unreadable:
                raise ApiError("PERMISSION_DENIED", f"Required '{permission}' permission for '{resource}'")

    def in_region(self, project: str, region: str) -> list[Subnetwork]:
        """Every subnet of the project in `region`, by name: the custom ones, then one per auto-mode network."""
        layout = self.layout(project)
        found = {s.name: s for s in layout.subnetworks if s.region == region}
        for net in layout.auto_mode_networks:
            found.setdefault(net, Subnetwork(name=net, region=region, network=net, ipCidrRange=auto_mode_range(region)))
        return [found[name] for name in sorted(found)]

    def find(self, project: str, region: str, name: str) -> Subnetwork | None:
        return next((s for s in self.in_region(project, region) if s.name == name), None)

    def check_create(self, project: str, zone: str, node: dict) -> None:
        """Refuse a node whose networkConfig names a subnet its region lacks, or one of another network. Without a
        subnetwork the network's subnet in the region is used (an auto-mode network's always exists)."""
        config = node.get("networkConfig") if isinstance(node.get("networkConfig"), dict) else {}
        region = zone_region(zone)
        network = _short(str(config.get("network") or "default"))
        ref = str(config.get("subnetwork") or "")
        if not ref:
            if not any(s.network == network for s in self.in_region(project, region)):
                raise subnetwork_error(project, region, network)
            return
        m = _SUBNET_REF.search(ref)
        named_region, name = (m.group(1), m.group(2)) if m else (region, _short(ref))
        subnet = self.find(project, region, name) if named_region == region else None
        if subnet is None:
            raise subnetwork_error(project, named_region, name)
        if subnet.network != network:
            raise subnetwork_error(project, region, name, network=network)
