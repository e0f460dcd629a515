"""A sweep's per-row search: its settings (config), its space in Hydra's grammar (space), Optuna's proposals
and pruner over the trials the store holds (search: the only module that imports optuna), and the
confirmation's sequential rule (sequential)."""
