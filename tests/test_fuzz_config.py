"""Malformed YAML configs: only ``ConfigError`` escapes, naming the file and the dotted key (drills/fuzz.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from drills.fuzz import ConfigCase, check_config, config_inputs
from pipelines_lib.config import ConfigError


@settings(max_examples=500, deadline=None)
@given(config_inputs())
def test_bad_configs_fail_with_a_config_error_naming_the_key(case: ConfigCase) -> None:
    check_config(case)


def test_the_config_check_catches_an_error_that_does_not_name_the_key() -> None:
    # The check itself can fail: a real error about rollout.eta does not satisfy a case about trainer.seed.
    with pytest.raises(AssertionError, match="does not name 'trainer.seed'"):
        check_config(ConfigCase(text="rollout: {eta: -1}", key="trainer.seed"))
    with pytest.raises(AssertionError, match="no 'did you mean 'group_size''"):
        check_config(ConfigCase(text="rollout: {etta: 1}", key="rollout.etta", typo_of="group_size"))
    check_config(ConfigCase(text="rollout: {etaa: 1}", key="rollout.etaa", typo_of="eta"))
    assert issubclass(ConfigError, ValueError)
