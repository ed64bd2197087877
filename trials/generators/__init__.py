"""Traffic generators: each type is one module with one spec and one small runtime interface
(trials.generators.base.TrafficGenerator). The runner and the schema know them only through
GENERATOR_TYPES; a new workload is a new module added here."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trials.generators.base import TrafficGenerator
from trials.generators.bulk_tcp import BulkTcp, BulkTcpSpec
from trials.generators.cbr_udp import CbrUdp, CbrUdpSpec
from trials.generators.transaction import Transaction, TransactionSpec
from trials.generators.web_poisson import WebPoisson, WebPoissonSpec

GENERATOR_TYPES: dict[str, type[TrafficGenerator]] = {
    g.type: g for g in (BulkTcp, CbrUdp, WebPoisson, Transaction)
}

Generator = Annotated[
    BulkTcpSpec | CbrUdpSpec | WebPoissonSpec | TransactionSpec, Field(discriminator="type")
]

__all__ = ["GENERATOR_TYPES", "Generator", "TrafficGenerator"]
