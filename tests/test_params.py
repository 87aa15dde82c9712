"""The campaign flow's typed ``overrides`` parameter (``flows.params``), through real Prefect.

The model is generated from the config dataclasses: the same fields and sections, typed, described by the same
docstrings. Prefect's parameter schema (the UI's form, the server's check of a deployment run) carries them; a bad
value is refused, naming the field, by the flow's parameter validation before the run starts and by the server
before a deployment run is even created.
"""

from __future__ import annotations

import dataclasses
import typing
import uuid
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.exceptions import PrefectHTTPStatusError

from flows.campaign import campaign
from flows.params import CampaignOverrides, Overrides
from pipelines_lib.config import CampaignConfig, preset_names
from pipelines_lib.configdoc import attribute_docs
from pipelines_lib.stages.campaign import init_campaign
from pipelines_lib.storage.store import Store


def _same_tree(cls: type, model: type[Overrides], where: str = "") -> None:
    hints = typing.get_type_hints(cls)
    assert set(model.model_fields) == {f.name for f in dataclasses.fields(cls)}, where or cls.__name__
    for name, doc in attribute_docs(cls).items():
        assert model.model_fields[name].description == doc, f"{where}{name}"
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            nested = typing.get_args(model.model_fields[f.name].annotation)[0]
            _same_tree(hints[f.name], nested, f"{where}{f.name}.")


def test_the_overrides_model_has_every_config_field_with_its_docstring() -> None:
    _same_tree(CampaignConfig, CampaignOverrides)


def test_dotted_overrides_round_trip_through_the_model_into_the_config() -> None:
    dotted = {"trainer.max_steps": 4, "trainer.optim.lr": 0.001, "eval.versions": "ends",
              "engine.prefill_buckets": (16, 64, 128), "workers": 3}
    model = CampaignOverrides.from_dotted(dotted)
    assert model.dotted() == dotted
    config = CampaignConfig.build(preset="smoke", overrides=model.dotted())
    assert (config.trainer.max_steps, config.trainer.optim.lr, config.eval.versions, config.workers) == \
        (4, 0.001, "ends", 3)
    assert config.rollout == CampaignConfig.preset("smoke").rollout  # what is not named keeps the preset's value


def test_the_campaign_flows_parameter_schema_has_the_typed_fields() -> None:
    schema = campaign.parameters.model_dump()
    assert schema["properties"]["overrides"]["anyOf"][0] == {"$ref": "#/definitions/CampaignConfigOverrides"}
    defs = schema["definitions"]
    top = defs["CampaignConfigOverrides"]
    assert top["additionalProperties"] is False
    assert top["properties"]["trainer"]["anyOf"][0] == {"$ref": "#/definitions/TrainerConfigOverrides"}
    trainer = defs["TrainerConfigOverrides"]["properties"]
    assert trainer["max_steps"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert "train/DONE.json" in trainer["max_steps"]["description"]
    assert defs["EvalConfigOverrides"]["properties"]["versions"]["anyOf"][0] == {"enum": ["all", "ends"],
                                                                                  "type": "string"}
    assert defs["EngineConfigOverrides"]["properties"]["prefill_buckets"]["anyOf"][0] == {
        "type": "array", "items": {"type": "integer"}}
    # OptimConfig serves the trainer and the warm start: one definition, referenced twice
    assert defs["SFTConfigOverrides"]["properties"]["optim"]["anyOf"][0] == {"$ref": "#/definitions/OptimConfigOverrides"}
    # the preset is a choice among the recipes' names, twostep among them
    assert schema["properties"]["preset"]["enum"] == list(preset_names()) and "twostep" in preset_names()


@pytest.mark.parametrize(("overrides", "needles"), [
    ({"trainer": {"max_steps": "many"}}, ("overrides.trainer.max_steps", "valid integer")),
    ({"trainer": {"max_stepz": 4}}, ("overrides.trainer", "unknown key 'max_stepz'; did you mean 'max_steps'?")),
    ({"eval": {"versions": "some"}}, ("overrides.eval.versions", "'all' or 'ends'")),
    ({"rollout": {"temperature": "hot"}}, ("overrides.rollout.temperature", "valid number")),
])
def test_prefect_refuses_a_bad_override_before_the_run_starts(prefect_api: str, tmp_path: Path,
                                                               overrides: dict, needles: tuple[str, ...]) -> None:
    url = tmp_path / "c"
    state = campaign(campaign_url=str(url), preset="smoke", overrides=overrides, return_state=True)
    assert state.is_failed()
    assert all(n in state.message for n in needles), state.message
    assert not url.exists()  # the flow's body never ran: no campaign folder


def test_the_server_refuses_a_deployment_run_with_a_bad_override(prefect_api: str) -> None:
    deployment_id = campaign.to_deployment(name=f"typed-{uuid.uuid4().hex[:8]}").apply()
    with get_client(sync_client=True) as client:
        with pytest.raises(PrefectHTTPStatusError, match=r"overrides\.trainer\.max_steps") as refused:
            client.create_flow_run_from_deployment(deployment_id, parameters={
                "campaign_url": "/tmp/never", "overrides": {"trainer": {"max_steps": "many"}}})
        assert refused.value.response.status_code == 409
        with pytest.raises(PrefectHTTPStatusError, match="max_stepz"):
            client.create_flow_run_from_deployment(deployment_id, parameters={
                "campaign_url": "/tmp/never", "overrides": {"trainer": {"max_stepz": 4}}})
        accepted = client.create_flow_run_from_deployment(deployment_id, parameters={
            "campaign_url": "/tmp/never", "overrides": {"trainer": {"max_steps": 4}}})
        assert accepted.parameters["overrides"] == {"trainer": {"max_steps": 4}}
        client.delete_flow_run(accepted.id)  # nothing runs it; the session's server stays tidy


def test_the_flow_builds_its_config_from_the_typed_overrides(prefect_api: str, tmp_path: Path) -> None:
    # A folder started on the plain smoke preset: the same URL with trainer.max_steps overridden is another
    # experiment, refused naming the section, so the overrides reached the config the flow built.
    store = Store(str(tmp_path / "c"))
    init_campaign(store, CampaignConfig.preset("smoke"))
    state = campaign(campaign_url=store.url, preset="smoke", overrides={"trainer": {"max_steps": 3}},
                     return_state=True)
    assert state.is_failed() and "sections differing: ['trainer']" in state.message, state.message


def test_an_out_of_range_override_fails_the_run_naming_the_field_before_any_stage(prefect_api: str,
                                                                                   tmp_path: Path) -> None:
    url = tmp_path / "c"  # ranges are the dataclasses' own checks, applied when the flow builds the config
    state = campaign(campaign_url=str(url), preset="smoke", overrides={"trainer": {"max_steps": 0}},
                     return_state=True)
    assert state.is_failed() and "max_steps" in state.message, state.message
    assert not url.exists()
