import pytest
"""`ddl-eval import-reference`: an authors' checkpoint becomes a run that lm-eval and the report see."""

import csv

import torch

from tests.conftest import mlflow_runs, run_cli
from tests.test_reference_parity import reference_state_dict


def byte_vocab_checkpoint(path, variant="ddl_dv4"):
    """The parity fixture's weights in the authors' layout, the embedding grown to the byte vocabulary."""
    state = {k: v.float() for k, v in reference_state_dict(variant).items()}
    wte = torch.cat([state["transformer.wte.weight"], 0.02 * torch.randn(256 - 32, 8)])
    state["transformer.wte.weight"] = state["lm_head.weight"] = wte
    torch.save(state, path)
    return path


@pytest.mark.slow
def test_an_imported_checkpoint_is_evaluated_and_reported(ddl_home, tmp_path):
    checkpoint = byte_vocab_checkpoint(tmp_path / "pytorch_model.bin")
    out = run_cli("ddl-eval", "import-reference", str(checkpoint), "--variant", "ddl_dv4", "--data", "embedded",
                  "--max-seq-len", "128")
    assert out.returncode == 0, out.stdout + out.stderr
    [run] = mlflow_runs("reference")
    signature = run.data.tags["ddl.signature"]
    assert run.info.status == "FINISHED" and signature.startswith("ref-")
    assert run.data.tags["ddl.imported_from"] == str(checkpoint)
    assert run.data.params["model.row"] == "ddl_dv4" and run.data.params["model.init"] == "reference"
    assert int(run.data.params["model.params"]) > int(run.data.params["model.ddl_extra_params"]) > 0   # as a job's
    assert run.data.params["seed"] == "imported" and not any(k.startswith("train.") for k in run.data.params)
    evaluated = run_cli("ddl-eval", signature, "--tasks", "ddl_continuation", "--limit", "8")
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    assert "logged to MLflow run(s)" in evaluated.stdout
    [run] = mlflow_runs("reference")
    assert "eval/0shot/ddl_continuation/reported" in run.data.metrics
    report = run_cli("ddl-report", "--experiment", "reference", "--out", str(tmp_path / "reports"))
    assert report.returncode == 0, report.stdout + report.stderr
    table = next((tmp_path / "reports" / "reference").glob("accuracy_*.csv"))
    with open(table) as f:
        rows = {r["row"] for r in csv.DictReader(f)}
    assert "ddl_dv4" in rows


@pytest.mark.slow
def test_a_checkpoint_of_another_variant_is_refused_in_one_line_leaving_nothing(ddl_home, tmp_path):
    checkpoint = byte_vocab_checkpoint(tmp_path / "dv4.pt")
    out = run_cli("ddl-eval", "import-reference", str(checkpoint), "--variant", "ddl_dv1", "--data", "embedded")
    assert out.returncode == 2
    assert out.stdout.strip() == ("ddl-eval: error: reference state dict: transformer.h.0.ddl_attn.v_proj.weight "
                                  "has shape (4, 8), the variant needs (1, 8)")
    assert mlflow_runs("reference") == [] and not (ddl_home / "runs").exists()
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    out = run_cli("ddl-eval", "import-reference", str(garbage), "--variant", "ddl_dv4")
    assert out.returncode == 2 and out.stdout.startswith(f"ddl-eval: error: checkpoint='{garbage}': not a torch")
    assert len(out.stdout.strip().splitlines()) == 1
