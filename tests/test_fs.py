from pathlib import Path
from typing import Any
from asynctier.testing import TierConformance
class TestFs(TierConformance):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "fs", "root": str(tmp_path / "kv")}
