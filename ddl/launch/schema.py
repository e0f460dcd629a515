"""ddl-run's config schema: conf/config.yaml and its groups as Hydra structured configs.

Each group's keys, types and defaults are read off the dataclass it fills: `model.*` and `ddl.*` off
ModelConfig (its ablation axes are top-level keys, its Delta knobs `ddl.*`, the rest `model.*` beside
the `size` that a conf/model/ file picks; a size's dimensions default to null: the size's value),
`data.*` off DataConfig, `train.*` off TrainConfig, `eval.*` off EvalConfig, `tune.*` off TuneConfig, `seed`
off RunConfig. A
field added to one of them is a key of ddl-run at once, with its type and default.

Hydra merges every YAML file and override into this schema (`register()` stores it as `ddl_schema`,
the first entry of config.yaml's defaults), so it refuses an unknown key and a value of the wrong
type itself; the dataclasses then check the values (spec.py). A `+key=value` override may add a key
the schema lacks (Hydra's + bypasses it): `undeclared` finds it. `unknown_key` and `type_error` are
the one-line messages for both refusals.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig

from ..data import DataConfig
from ..eval.config import EvalConfig
from ..model import SIZES, ModelConfig
from ..model.config import DDL_KNOBS
from ..train import RunConfig, TrainConfig
from ..tune.config import TuneConfig
from ..validation import shown

AXES = ("residual", "dv", "conv", "mapping", "beta_init")   # ModelConfig fields that are top-level keys
SIZE_DIMS = tuple(next(iter(SIZES.values())))                # model.n_layer, ...: null takes the size's value
DERIVED = ("vocab_size",)                                    # the data's tokenizer sets it: not a key


def _key_type(hint) -> Any:
    """A field's type as OmegaConf takes it: `X | None` -> Optional[X], `tuple[X, ...]` -> List[X]."""
    args = typing.get_args(hint)
    if type(None) in args:
        return Optional[_key_type(next(a for a in args if a is not type(None)))]
    if typing.get_origin(hint) is tuple:
        return List[args[0]]
    return hint


def _keys(source: type, names, default: str = "source") -> list[tuple]:
    """make_dataclass's (name, type, field) for `source`'s fields `names`, each with the source's default,
    or null (`default="null"`: the field is then optional), or none (`"yaml"`: config.yaml sets it)."""
    hints = typing.get_type_hints(source)
    defaults = {f.name: f.default for f in dataclasses.fields(source)}
    keys = []
    for name in names:
        kind = _key_type(hints[name])
        if default == "null":
            keys.append((name, Optional[kind], dataclasses.field(default=None)))
        elif default == "yaml":
            keys.append((name, kind, dataclasses.field(default=MISSING)))
        elif isinstance(defaults[name], tuple):
            keys.append((name, kind, dataclasses.field(default_factory=list(defaults[name]).copy)))
        else:
            keys.append((name, kind, dataclasses.field(default=defaults[name])))
    return keys


def _schema(name: str, keys: list[tuple]) -> type:
    """A dataclass importable by its name from this module, so that a pickled job config finds it."""
    schema = dataclasses.make_dataclass(name, keys)
    schema.__module__ = __name__
    return schema


def _names(source: type) -> list[str]:
    return [f.name for f in dataclasses.fields(source)]


def _group(schema: type) -> dataclasses.Field:
    return dataclasses.field(default_factory=schema)


_MODEL_REST = [n for n in _names(ModelConfig) if n not in AXES + DDL_KNOBS + DERIVED + SIZE_DIMS]
ModelGroup = _schema("ModelGroup", [("size", str, dataclasses.field(default=MISSING)),   # conf/model/<size>.yaml
                                    ("head_size", Optional[int], dataclasses.field(default=None)),  # model_config's
                                    *_keys(ModelConfig, SIZE_DIMS, default="null"), *_keys(ModelConfig, _MODEL_REST)])
DDLGroup = _schema("DDLGroup", _keys(ModelConfig, [n for n in DDL_KNOBS if n not in AXES]))
DataGroup = _schema("DataGroup", _keys(DataConfig, _names(DataConfig)))
TrainGroup = _schema("TrainGroup", _keys(TrainConfig, _names(TrainConfig)))
EvalGroup = _schema("EvalGroup", _keys(EvalConfig, _names(EvalConfig)))
TuneGroup = _schema("TuneGroup", _keys(TuneConfig, _names(TuneConfig)))
RunSchema = _schema("RunSchema", [
    ("model", ModelGroup, _group(ModelGroup)), ("data", DataGroup, _group(DataGroup)),
    ("train", TrainGroup, _group(TrainGroup)), ("eval", EvalGroup, _group(EvalGroup)),
    ("ddl", DDLGroup, _group(DDLGroup)), ("tune", TuneGroup, _group(TuneGroup)),
    *_keys(ModelConfig, AXES, default="yaml"), *_keys(RunConfig, ["seed", "replica"], default="yaml"),
    ("experiment", str, dataclasses.field(default=MISSING)),    # the MLflow experiment (one per sweep)
    ("dry_run", bool, dataclasses.field(default=MISSING)),      # print the job table, launch nothing
    ("detect", Optional[float], dataclasses.field(default=None)),   # the gap to resolve, a share of the baseline's
    ("seed_sd", Optional[float], dataclasses.field(default=None)),  # loss; a seed's sd (nats) where the store has none
])


def known_keys(schema: type = RunSchema, prefix: str = "") -> list[str]:
    """Every key of ddl-run's config, dotted (`model.n_layer`, `dv`, ...), in the schema's order."""
    keys = []
    for f in dataclasses.fields(schema):
        keys += known_keys(f.type, f"{prefix}{f.name}.") if dataclasses.is_dataclass(f.type) else [prefix + f.name]
    return keys


def undeclared(cfg: DictConfig, schema: type = RunSchema, prefix: str = "") -> str | None:
    """The first key of `cfg` the schema lacks (one a `+key=value` override added), dotted; None if none."""
    types = {f.name: f.type for f in dataclasses.fields(schema)}
    for key in cfg:
        if key == "hydra" and schema is RunSchema:      # a sweep's job config carries Hydra's own node
            continue
        if key not in types:
            return prefix + str(key)
        if dataclasses.is_dataclass(types[key]) and (found := undeclared(cfg[key], types[key], f"{prefix}{key}.")):
            return found
    return None


_NOTHING = object()


def unknown_key(key: str, value=_NOTHING) -> str:
    """The one line for a key ddl-run does not have, with the closest real key (by spelling, else by
    its last part: `lr` -> `train.lr`)."""
    keys = known_keys()
    leaf = key.rsplit(".", 1)[-1]
    near = difflib.get_close_matches(key, keys, n=1, cutoff=0.6) or [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    named = key if value is _NOTHING else f"{key}={shown(value)}"
    return f"{named}: unknown key" + (f"; did you mean {near[0]}?" if near else " (ddl-run --help lists them)")


_KINDS = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"),
          str: ("a string", "strings")}


def _described(hint) -> str:
    args = typing.get_args(hint)
    if type(None) in args:
        return f"{_described(next(a for a in args if a is not type(None)))} or null"
    if typing.get_origin(hint) is list:
        return f"a list of {_KINDS.get(args[0], ('', 'values'))[1]}"
    if dataclasses.is_dataclass(hint):
        return f"a group of keys ({', '.join(known_keys(hint))})"
    return _KINDS.get(hint, (f"a {getattr(hint, '__name__', hint)}",))[0]


def type_error(err) -> str:
    """`key=value: must be <its type>` for a value Hydra refused (err: OmegaConf's ValidationError, raised
    for a field of a schema, or for an item of a list field)."""
    if dataclasses.is_dataclass(err.object_type):
        hint = typing.get_type_hints(err.object_type).get(err.key)
    else:
        hint = (typing.get_args(err.ref_type) or (Any,))[0]
    return f"{err.full_key}={shown(err.value)}: must be {_described(hint)}"
