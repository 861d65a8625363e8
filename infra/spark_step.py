"""Driver entry of the cluster profile's ``SparkApplication``\\ s (``infra/k8s``).

spark-operator runs a Python file as the driver; this one runs ``cascade step ARGS...``, the same
function the Airflow task and the DVC stage call, so a Spark step is one code path in both
profiles. The step's ``build_session`` finds the session spark-submit configured.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from cascade.cli import main as cascade_main

    return cascade_main(["step", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
