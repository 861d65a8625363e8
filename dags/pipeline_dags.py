"""Every registered pipeline as an Airflow DAG (ctr_preranking, ctr_cross, asr, multimodal,
ctr_monitor, and whatever else registers under the ``cascade.pipelines`` entry point).

Wiring only: each DAG is made from its pipeline's spec by :func:`cascade.dag_factory.build_dag`;
``cascade pipelines`` lists them. Nothing heavy is imported at parse time.
"""

from __future__ import annotations

from cascade.dag_factory import build_dags

# The DAG processor collects DAG objects from this module's globals (airflow.sdk DAGs).
globals().update(build_dags())
