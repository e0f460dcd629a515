"""MLflow tracking: the only package that imports mlflow (lazily)."""
