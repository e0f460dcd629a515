"""Deep Delta Learning experiment orchestrator.

Layers (data flows down): cli -> launch -> train -> {model, data}; track, eval, report beside.
See docs/DESIGN.md.
"""

__version__ = "0.1.0"
