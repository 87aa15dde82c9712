"""Typed flow parameters: the campaign overrides as a pydantic model generated from the config dataclasses.

Prefect builds a flow's parameter schema (the UI's run form, and the server's check of a deployment run's
parameters) from the type hints of its signature; ``dict[str, Any]`` gives neither. ``overrides_model`` walks the
frozen dataclass tree of ``CampaignConfig`` once:

```
CampaignConfig  ->  CampaignConfigOverrides     seed: int | None, workers: int | None, ...
  trainer: TrainerConfig  ->  trainer: TrainerConfigOverrides | None     max_steps: int | None, ...
    optim: OptimConfig    ->    optim: OptimConfigOverrides | None       (one model per class, shared)
```
Every field keeps its type (Literal choices, tuples, optional values), defaults to None (keep what the preset and
the YAML say) and is described by its attribute docstring, the text of ``docs/CONFIG.md``; unknown keys are refused
with a "did you mean". The fields are declared once, in the dataclasses, so the form cannot drift from them.

Pydantic checks types and choices: in the flow's own parameter validation, before the run starts, and, for a
deployment run, in the Prefect server against the deployment's schema. Ranges and cross-field rules stay in the
dataclasses' ``__post_init__``; the flow applies them when it builds the config (``CampaignConfig.build``: the
preset, the YAML, then ``overrides.dotted()``), because a value is only out of range relative to the rest.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, create_model, model_validator

from pipelines_lib.config import CampaignConfig, preset_names
from pipelines_lib.configdoc import attribute_docs
from pipelines_lib.configio import nest_dotted


class Overrides(BaseModel):
    """Base of the generated models: a partial config, None meaning "not overridden"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """An unknown key names the closest valid one (pydantic alone says only "extra inputs are not permitted")."""
        if isinstance(data, Mapping):
            for key in data:
                if key not in cls.model_fields:
                    close = difflib.get_close_matches(str(key), list(cls.model_fields), n=1)
                    hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {sorted(cls.model_fields)}"
                    raise ValueError(f"unknown key {key!r}; {hint}")
        return data

    def dotted(self) -> dict[str, Any]:
        """The overridden leaves as ``CampaignConfig.with_overrides`` takes them: ``{"trainer.max_steps": 4}``."""
        out: dict[str, Any] = {}
        for name, value in self:
            if isinstance(value, Overrides):
                out.update({f"{name}.{key}": v for key, v in value.dotted().items()})
            elif value is not None:
                out[name] = value
        return out

    @classmethod
    def from_dotted(cls, dotted: Mapping[str, Any]) -> Overrides:
        """``{"trainer.max_steps": 4}`` (``--set`` items) as this model; a bad key or value raises
        ``pydantic.ValidationError`` naming it."""
        return cls.model_validate(nest_dotted(dotted))


def _field_type(tp: Any) -> Any:
    """A dataclass field's type as a pydantic field type (nested configs become their overrides models).

    ``int``, ``bool`` and ``str`` are strict, as ``configio`` is: ``"4"`` is not a step count, nor ``1`` a flag."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return overrides_model(tp)
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(lambda a, b: a | b, [_field_type(arg) for arg in typing.get_args(tp)])
    if origin is tuple:
        args = typing.get_args(tp)
        return tuple[_field_type(args[0]), ...] if args else tuple
    if origin is dict:
        key, value = typing.get_args(tp) or (str, Any)
        return dict[key, _field_type(value)]  # type: ignore[valid-type]
    if tp in (int, bool, str):
        return Annotated[tp, Strict()]
    return tp  # float (an int is a float), Literal[...], Any


@functools.cache
def overrides_model(cls: type) -> type[Overrides]:
    """``<cls>Overrides``: every field of dataclass ``cls`` optional, with its type and attribute docstring."""
    hints = typing.get_type_hints(cls)
    docs = attribute_docs(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        doc = docs.get(f.name) or (_class_doc(tp) if dataclasses.is_dataclass(tp) else None)
        fields[f.name] = (_field_type(tp) | None, Field(default=None, description=doc))
    return create_model(f"{cls.__name__}Overrides", __base__=Overrides, __doc__=_class_doc(cls), **fields)


def _class_doc(cls: type) -> str | None:
    """The first line of a class's own docstring (not the signature ``dataclass`` writes when it has none)."""
    doc = (cls.__doc__ or "").strip()
    return None if not doc or doc.startswith(f"{cls.__name__}(") else inspect.cleandoc(doc).split("\n")[0]


CampaignOverrides = overrides_model(CampaignConfig)
"""The ``overrides`` parameter of the campaign flow: any subset of ``CampaignConfig``, nested by section."""

Recipe = Literal[preset_names()]
"""The ``preset`` parameter of the campaign flow: a recipe's name (``recipes/<name>.yaml``), the folder as it is when
the flow is imported (a deployment made before a recipe was added needs deploying again), so the form offers them
and the server refuses another."""
