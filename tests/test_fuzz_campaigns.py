"""Random edits of a real campaign (metadata bytes, shard bytes, names, links) through the operator's commands:
each ends with its report or one line and exit 2, never a traceback (contract: drills/fuzz_campaign.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from drills.fuzz_campaign import CampaignCase, campaign_inputs, check_campaign


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(campaign_inputs())
def test_every_command_on_a_randomly_damaged_campaign_ends_in_a_report_or_one_line(case: CampaignCase) -> None:
    check_campaign(case)
