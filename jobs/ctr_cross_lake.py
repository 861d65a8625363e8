"""Where the cross statistics engine writes under the lake (:class:`CrossLake`): each pair's
partition, the item catalogue, the quarantine, the summary the gate reads and the gate's
verdict, and removing a partition's outputs that no verdict vouches for."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from cascade.lake import Lake
from domains.ctr.catalogue import gate_passed
from jobs.ctr_cross_config import CrossPair


@dataclass(frozen=True)
class CrossLake:
    """Where the engine writes, under the lake root (nothing here touches the disk)."""

    lake: Lake
    source: str

    def pair(self, pair: CrossPair, ds: str) -> Path:
        return self.lake.root / "features" / "ctr_cross" / self.source / pair.name / f"dt={ds}"

    def pair_root(self, pair: CrossPair) -> Path:
        return self.lake.root / "features" / "ctr_cross" / self.source / pair.name

    def catalogue(self, ds: str) -> Path:
        """:func:`item_catalogue` of partition ``ds`` (:meth:`cascade.lake.Lake.ctr_catalogue`,
        where a server reads it too)."""
        return self.lake.ctr_catalogue(self.source, ds)

    def quarantine(self, ds: str) -> Path:
        return self.lake.quarantine(f"{self.source}_log", ds)

    def summary(self, ds: str) -> Path:
        return self.lake.reports(f"ctr_cross_stats_{self.source}", ds) / "summary.json"

    def gate_report(self, ds: str) -> Path:
        """The verdict of :mod:`jobs.ctr_cross_stats_gate` on partition ``ds``
        (:meth:`cascade.lake.Lake.ctr_cross_gate_report`)."""
        return self.lake.ctr_cross_gate_report(self.source, ds)

    def outputs(self, ds: str) -> list[Path]:
        """What a build of partition ``ds`` leaves, besides its quarantine: every pair's
        partition (whichever pairs an earlier build computed), the catalogue and the summary."""
        pairs = sorted((self.lake.root / "features" / "ctr_cross" / self.source).glob(f"*/dt={ds}"))
        found = [*pairs, self.catalogue(ds), self.summary(ds)]
        return [path for path in found if path.exists()]

    def remove_ungated(self, ds: str) -> list[Path]:
        """Remove partition ``ds``'s outputs unless its gate passed them (a build that failed
        or was refused after deleting the verdict leaves nothing unchecked in the lake)."""
        if gate_passed(self.gate_report(ds)):
            return []
        removed = self.outputs(ds)
        for path in removed:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        return removed
