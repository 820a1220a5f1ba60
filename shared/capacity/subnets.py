"""Subnets are regional: which regions need the fleet's subnet, and the command that creates one there.

A TPU node's `networkConfig.subnetwork` must name a subnet in the node's region (Cloud TPU, "Configure networking
and access": "The subnetwork must be in the same region as the zone where the TPU runs",
https://cloud.google.com/tpu/docs/configure-networking-access), and the executor's Direct VPC egress needs one in
the Cloud Run service's region (production-facts.md, "Subnets are regional"). The fleet file names one
`subnetwork`, so a subnet of that name must exist in each of those regions. An auto-mode network has a subnet of
its own name in every region (the `default` network's `default` subnet is everywhere); a custom-mode network has
only the subnets its owner created, and a TPU create in any other region is refused.

tpuq never creates one (network settings are the owner's): `tpuq deploy` reads each region's subnet and prints this
command for a missing one (tpuq.deploy.network), and the claimer, refused by the TPU API anyway, stops that region
and shows the same command (tpuq.claimer.classify.subnet_reason).
"""

from __future__ import annotations

import zlib

from tpuq.contracts.fleet import FleetFile

# The example range is a /20 (4,096 addresses: room for a v5e-256's 64 hosts; Direct VPC egress needs /26 or more)
# in 10.64.0.0/10, outside the 10.128.0.0/9 that auto-mode networks use, picked from the region's name so that deploy
# and the claimer print the same range and two regions of one fleet almost never get the same. Any free range will do.
EXAMPLE_RANGE_BLOCKS = 1024  # the /20 blocks of 10.64.0.0/10


def example_subnet_range(region: str) -> str:
    block = zlib.crc32(region.encode()) % EXAMPLE_RANGE_BLOCKS
    return f"10.{64 + block // 16}.{(block % 16) * 16}.0/20"


def subnet_create_command(fleet: FleetFile, region: str) -> str:
    """What the network's owner runs to create the fleet's subnet in `region` (tpuq never runs it)."""
    return (f"gcloud compute networks subnets create {fleet.subnetwork} --network={fleet.network} "
            f"--region={region} --range={example_subnet_range(region)} --project={fleet.project}")
