"""What `fusion-cache show FID --ir` prints beyond the store's rows: the Fusion IR and which
scheduler takes the fusion, with every refusal's reason. It rebuilds the definition with
the frontend (torch), so only --ir imports it."""
from __future__ import annotations

from typing import Any


def describe_fusion(entry: Any) -> str:
    from fusion_cache.frontend.definition import FusionDefinition
    from fusion_cache.ir.decompose import expand_composites
    from schedulers.registry import schedule

    fd = FusionDefinition(entry.id)
    # what the executor schedules: composite ops expanded into primitives
    name, program, refusals = schedule(expand_composites(fd))
    lines = ["Fusion IR:", fd.fusion_ir()]
    if name is None:
        lines.append("analysis: no scheduler takes it whole (it is segmented, or the reference "
                     "evaluator runs what no scheduler knows)")  # fmt: skip
    else:
        detail = program.describe()
        family, _, rest = detail.partition(": ")  # describe() starts with its family's name
        lines.append(f"analysis: {name} takes it whole "
                     f"({rest if family.replace('-', '_') == name else detail})")
    lines += [f"  refused by {r}" for r in refusals]
    return "\n".join(lines) + "\n"
