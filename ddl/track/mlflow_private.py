"""Every private name of MLflow the project uses, and nothing else: an upgrade that moves one breaks this module
alone, and tests/test_private_apis.py says which name and which MLflow version. Imports are lazy (MLflow takes
seconds to import)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

CHECKED_WITH = "3.17.2"


def create_schema(db: Path) -> None:
    """MLflow's tables at its head revision in a new SQLite file: what SqlAlchemyStore runs on an empty database."""
    from mlflow.store.db import utils as db_utils
    engine = db_utils.create_sqlalchemy_engine(f"sqlite:///{db}")
    try:
        db_utils._initialize_tables(engine)
    finally:
        engine.dispose()


def at_schema_head(db: Path) -> bool:
    """Whether an SQLite file holds every table of MLflow's schema at its head revision (what SqlAlchemyStore
    checks), read through an engine of its own: MLflow caches its store's engine per URI."""
    from mlflow.store.db import utils as db_utils
    engine = db_utils.create_sqlalchemy_engine(f"sqlite:///{db}")
    try:
        return db_utils._all_tables_exist(engine) and (
            db_utils._get_schema_version(engine) == db_utils._get_latest_schema_revision())
    except Exception:
        return False
    finally:
        engine.dispose()


def system_metrics_monitor(run_id: str, tracking_uri: str, take: Callable[[dict[str, float], int], None]):
    """MLflow's own system metrics (CPU, memory, disk, network; GPU where its library finds one) for the
    run while it trains, each sample handed to `take(metrics, step)` rather than to MLflow's own logger:
    a started monitor to finish(), or None where psutil is missing. The samples' names and steps are the
    monitor's private state."""
    try:
        import psutil  # noqa: F401 - MLflow's monitors need it
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError:
        return None
    import logging

    class Monitor(SystemMetricsMonitor):
        def publish_metrics(self, metrics):
            prefix = self._metrics_prefix + (self.node_id + "/" if self.node_id else "")
            take({prefix + k: v for k, v in metrics.items()}, self._logging_step)
            self._logging_step += 1
            for monitor in self.monitors:
                monitor.clear_metrics()

    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)     # no start/stop lines per job
    monitor = Monitor(run_id, resume_logging=True, tracking_uri=tracking_uri)
    monitor.start()
    return monitor
