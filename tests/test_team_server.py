"""The team server (scripts/mlflow-team): a private PostgreSQL behind `mlflow server --serve-artifacts`, run
and stopped by its own PIDs; a run logged through it lands in PostgreSQL and its artifacts in the server's
artifact store."""

import contextlib

from tests.conftest import run_cli

SMOKE = ["model=micro", "train=smoke", "train.steps=20"]


def query(server, sql: str, *params) -> list[tuple]:
    """Rows of `sql` in the server's MLflow database, read as MLflow's role over TCP (its password from pgpass)."""
    import psycopg2
    settings = dict(line.split("=", 1) for line in (server.dir / "team.env").read_text().split())
    with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=settings["PG_PORT"], user="mlflow",
                                             dbname="mlflow", passfile=str(server.dir / "pgpass"))) as db:
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()


def test_a_run_logged_through_the_server_lands_in_postgresql_and_its_artifact_store(team_server, ddl_home):
    out = run_cli("ddl-run", *SMOKE, "experiment=team-store", env_extra={"MLFLOW_TRACKING_URI": team_server.uri})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [(run_id, status, artifact_uri)] = query(team_server, "SELECT r.run_uuid, r.status, r.artifact_uri FROM runs r "
                                                          "JOIN experiments e USING (experiment_id) WHERE e.name = %s",
                                             "team-store")
    assert status == "FINISHED" and artifact_uri.startswith("mlflow-artifacts:/"), artifact_uri
    steps = query(team_server, "SELECT step FROM metrics WHERE run_uuid = %s AND key = 'train/loss' ORDER BY step",
                  run_id)
    assert steps and steps[-1] == (20,), steps
    stored = team_server.dir / "artifacts" / artifact_uri.removeprefix("mlflow-artifacts:/")
    assert (stored / "config.yaml").is_file() and (stored / "train.log").is_file(), sorted(stored.rglob("*"))
    assert not (ddl_home / "mlflow.db").exists() and not (ddl_home / "mlartifacts").exists()

