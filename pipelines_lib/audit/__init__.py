"""Dataset audit and lineage of a campaign folder (ARCHITECTURE §4 "audit"), and its export for warehouse tools.

- ``campaign.audit_campaign(store) -> report.AuditReport``: the IO; reads the folder once, a version folder
  (``unit.Unit``) at a time, decoded by ``worker`` in this process or on worker processes (``pool``), merged
  there.
- ``state``: the records a restart reads (pointer entries, checkpoints, cursors, evaluations, the config), checked;
  ``recover`` refuses a campaign with such a finding.
- ``stats``: summaries (pure); ``lineage``: reconciles consumption logs (pure).
- ``report``: the frozen result, ``to_json()`` and ``render_text()``.
- ``export``: committed valid shards as one Parquet file per policy version.
"""

from pipelines_lib.audit.campaign import audit_campaign
from pipelines_lib.audit.report import AuditReport

__all__ = ["AuditReport", "audit_campaign"]
