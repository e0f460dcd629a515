"""Sweeps: Hydra config -> validated jobs -> signatures -> submitit (the only place importing submitit)."""
