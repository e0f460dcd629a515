"""The paper's tables and Figure 2 rebuilt from MLflow runs (pandas + matplotlib; no mlflow import here)."""
