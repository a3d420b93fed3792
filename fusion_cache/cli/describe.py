"""What `fusion-cache show FID` prints beyond the store's rows: the Fusion IR and which
scheduler takes the fusion, with every refusal's reason."""
from __future__ import annotations

from typing import Any


def describe_fusion(entry: Any) -> str:
    from fusion_cache.frontend.definition import FusionDefinition
    from schedulers.registry import schedule

    fd = FusionDefinition(entry.id)
    name, program, refusals = schedule(fd)
    lines = ["Fusion IR:", fd.fusion_ir()]
    if name is None:
        lines.append("scheduler: none (runs on the reference evaluator)")
    else:
        lines.append(f"scheduler: {name}: {program.describe()}")
    lines += [f"  refused by {r}" for r in refusals]
    return "\n".join(lines) + "\n"


def install() -> None:
    from . import store_commands

    store_commands.describe_fusion = describe_fusion
