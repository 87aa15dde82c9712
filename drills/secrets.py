"""The secret-leak drill: plant fake credentials, run the stages that write outputs, grep everything they wrote.

Planted, all fake and unique: secret-looking environment variables (``GOOGLE_APPLICATION_CREDENTIALS`` pointing at
a fake service-account file, ``ROLLSTREAM_API_TOKEN``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``) and a ``token``
storage option given to the campaign's ``Store`` and to the ``rollstream audit`` command line. Then a tiny
campaign runs in this process: init, prep, publish a random-init model as v0, collect a few groups (or, in the
quick variant, commit synthetic groups through the folder channel's writer), telemetry flush and Perfetto export,
``audit_campaign`` (report written under ``audit/``) and ``rollstream audit --json``. Everything printed or
logged meanwhile is captured.

The search covers every file under the drill folder (campaign, trace, captured logs), both as raw bytes and,
for Arrow files (shards and dataset are compressed, so a raw grep would miss them), as decoded rows and
schema metadata. Each (secret, file) hit is a leak; their count is ``reliability.secret_leaks``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

FAKE_PRIVATE_KEY = "FAKE-PRIVATE-KEY-3f9a1c77e2b54d08a6b1"
FAKE_CLIENT_EMAIL = "drill-leak-probe@fake-project.iam.gserviceaccount.com"
API_TOKEN = "sk-test-rollstream-7d1e0b9c4a2f4e55"
HF_TOKEN = "hf_FakeDrillToken8c3b2a1d0e9f"
AWS_SECRET = "wJalrFAKEdrillKEY/K7MDENG/bPxRfiCYEXAMPLE"
STORAGE_TOKEN = "ya29.fake-storage-option-token-5e6f7a8b"


@dataclass(frozen=True, kw_only=True)
class Leak:
    secret: str
    """Which planted secret (its name, never its value)."""
    file: str


@dataclass(frozen=True, kw_only=True)
class SecretReport:
    files_scanned: int
    secrets_planted: int
    leaks: tuple[Leak, ...]
    stages: tuple[str, ...]


@contextlib.contextmanager
def planted_secrets(root: Path) -> Iterator[dict[str, str]]:
    """Set the fake credential variables (restored afterwards); yields secret name -> value to search for."""
    sa = root / "fake-sa.json"
    sa.write_text(json.dumps({"type": "service_account", "private_key": FAKE_PRIVATE_KEY,
                              "client_email": FAKE_CLIENT_EMAIL}))
    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(sa), "ROLLSTREAM_API_TOKEN": API_TOKEN, "HF_TOKEN": HF_TOKEN,
           "AWS_SECRET_ACCESS_KEY": AWS_SECRET}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield {**env, "service_account.private_key": FAKE_PRIVATE_KEY,
               "service_account.client_email": FAKE_CLIENT_EMAIL, "storage_option.token": STORAGE_TOKEN}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def captured_output(into: Path) -> Iterator[None]:
    """stdout, stderr and every log record (DEBUG and up) of this process, written to ``into`` afterwards."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setLevel(logging.DEBUG)
    root_logger = logging.getLogger()
    old_level = root_logger.level
    root_logger.addHandler(handler)
    root_logger.setLevel(logging.DEBUG)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            yield
    finally:
        root_logger.removeHandler(handler)
        root_logger.setLevel(old_level)
        into.write_text(buf.getvalue())


def _texts(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    yield data
    if path.suffix == ".arrow" and data.startswith(b"ARROW1"):
        with contextlib.suppress(pa.ArrowInvalid, OSError):
            table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
            yield repr(table.schema.metadata).encode()
            yield json.dumps(table.to_pylist(), default=str).encode()


def scan(folder: Path, secrets: dict[str, str], *, skip: tuple[Path, ...] = ()) -> tuple[int, list[Leak]]:
    """Files scanned under ``folder`` and every (secret, file) pair where a secret value appears."""
    leaks: list[Leak] = []
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p not in skip]
    for path in files:
        blobs = list(_texts(path))
        for name, value in secrets.items():
            if any(value.encode() in b for b in blobs):
                leaks.append(Leak(secret=name, file=str(path.relative_to(folder))))
    return len(files), leaks


def _synthetic_rollouts(store: Any, config: Any) -> None:
    from pipelines_lib.trajectory.folder import FolderChannel
    from pipelines_lib.trajectory.synthetic import synthetic_group

    writer = FolderChannel(store).writer("drill.0")
    for i in range(3):
        writer.add_group(synthetic_group(prompt_id=f"p{i}", group_size=config.rollout.group_size, worker_id="drill.0",
                                         policy_version=0, seed=i, vocab_size=config.model.vocab_size, max_len=40))
    writer.flush()


def run_secret_drill(root: Path, *, real_rollouts: bool = True, groups: int = 2,
                     progress: Callable[[str], None] = lambda s: None) -> SecretReport:
    """Run the stages with secrets planted under ``root`` (a fresh folder) and scan what they wrote."""
    from flax import nnx

    from pipelines_lib import telemetry
    from pipelines_lib.cli import main as cli_main
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.dataset import prep
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.publish import publish_weights
    from pipelines_lib.stages.audit import audit
    from pipelines_lib.stages.campaign import init_campaign
    from pipelines_lib.storage.store import Store
    from pipelines_lib.telemetry.trace import read_records, to_chrome_trace

    root.mkdir(parents=True, exist_ok=True)
    stages: list[str] = []
    with planted_secrets(root) as secrets, captured_output(root / "captured.log"):
        config = CampaignConfig.tiny()
        url = str(root / "campaign")
        store = Store(url, storage_options={"token": STORAGE_TOKEN})
        init_campaign(store, config)
        stages.append("init")
        prep(store, config.dataset, storage_options={"token": STORAGE_TOKEN}, env=config.env)
        stages.append("prep")
        publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(0)), version=0, step=0)
        stages.append("publish")
        if real_rollouts:
            from pipelines_lib.stages.collect import collect

            collect(store, config, worker="drill", worker_index=0, num_workers=1, target_groups=groups, log=print)
            stages.append("collect")
        else:
            with telemetry.recording(store, "drill"), telemetry.span("synthetic_rollouts", track="drill"):
                _synthetic_rollouts(store, config)
            stages.append("synthetic_rollouts")
        (root / "trace.json").write_text(json.dumps(to_chrome_trace(read_records(store))))
        stages.append("telemetry")
        kept = audit(store, progress=print)
        print(store.read(kept["text"]).decode())
        stages.append("audit")
        code = cli_main(["audit", url, "--json", "--storage-option", f"token={STORAGE_TOKEN}"])
        stages.append(f"cli_audit(exit {code})")
        print(f"python {sys.version.split()[0]}; stages {stages}")
    n_files, leaks = scan(root, secrets, skip=(root / "fake-sa.json",))
    progress(f"secrets: {n_files} files scanned, {len(leaks)} leak(s)")
    return SecretReport(files_scanned=n_files, secrets_planted=len(secrets), leaks=tuple(leaks), stages=tuple(stages))


__all__ = ["Leak", "SecretReport", "captured_output", "planted_secrets", "run_secret_drill", "scan"]
