"""Every measured figure the README and docs/ quote is the one ``bench/results.json`` records (``bench.figures``)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import registry
from bench.figures import documents, problems, rerender
from bench.registry import Bench, BenchResult, load_benches
from bench.runner import run_benchmarks

ROOT = Path(__file__).resolve().parents[1]
RECORD = {"figures": {"tpu.campaign_wall_s": 186.634, "learning.v0_success": 0.0078}, "labels": {"tpu.device": "v5e"}}


def test_the_readme_and_docs_quote_only_recorded_figures_at_their_recorded_values() -> None:
    record = json.loads((ROOT / "bench" / "results.json").read_text())
    docs = documents(ROOT)
    assert ROOT / "README.md" in docs and ROOT / "docs" / "RESULTS.md" in docs
    found = [p for doc in docs for p in problems(doc.read_text(), record, str(doc.relative_to(ROOT)))]
    assert found == []
    quoted = "".join(doc.read_text() for doc in docs)
    assert "<!-- figures:" in quoted and "(`learning.heldout_gain_pts`)" in quoted  # the scan has something to read


def test_a_citation_must_round_to_the_recorded_value_at_its_written_precision() -> None:
    ok = "took 186.6 s (`tpu.campaign_wall_s`), about 187 s (`tpu.campaign_wall_s`), from 0.78 % (`learning.v0_success`)"
    assert problems(ok, RECORD, "doc.md") == []
    stale = "line one\nit took 170 s (`tpu.campaign_wall_s`)"
    assert problems(stale, RECORD, "doc.md") == ["doc.md:2: cites 170 s for 'tpu.campaign_wall_s', recorded 186.6"]
    assert problems("0.0078 % (`learning.v0_success`)", RECORD, "d")  # a percentage reads the fraction times 100


def test_a_citation_of_a_key_the_record_lacks_is_named() -> None:
    assert problems("about 3 s (`tpu.campain_wall_s`)", RECORD, "doc.md") == [
        "doc.md:1: cites 'tpu.campain_wall_s', which bench/results.json does not record"]


def test_a_figures_block_is_rendered_from_the_record_and_a_stale_one_is_named() -> None:
    stale = "intro\n<!-- figures: tpu.campaign_wall_s tpu.device -->\n| figure | value |\n|---|---|\n" \
            "| `tpu.campaign_wall_s` | 170 |\n| `tpu.device` | v5e |\n<!-- /figures -->\n"
    assert problems(stale, RECORD, "doc.md") == [
        "doc.md:2: figures block differs from bench/results.json (run `rollstream bench` or re-render it with "
        "bench.figures.rerender)"]
    fresh = rerender(stale, RECORD)
    assert "| `tpu.campaign_wall_s` | 186.6 |" in fresh and "| `tpu.device` | v5e |" in fresh
    assert problems(fresh, RECORD, "doc.md") == [] and rerender(fresh, RECORD) == fresh
    missing = rerender("<!-- figures: tpu.gone -->\n<!-- /figures -->", RECORD)
    assert problems(missing, RECORD, "d") == ["d:1: figures block names 'tpu.gone', which bench/results.json does not record"]


def test_a_benchmark_run_re_renders_the_figures_blocks_of_the_readme_and_docs(monkeypatch, tmp_path: Path) -> None:
    load_benches()
    monkeypatch.setitem(registry.BENCHES, "toy", Bench(name="toy", title="Toy", measures="nothing real",
                                                        method="returns a constant", goals=(),
                                                        fn=lambda ctx: BenchResult(figures={"toy.rate": 2.5})))
    block = "<!-- figures: toy.rate -->\n<!-- /figures -->\n"
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# r\n" + block)
    (tmp_path / "docs" / "X.md").write_text(block)
    (tmp_path / "docs" / "PLAIN.md").write_text("no figures here\n")
    run_benchmarks(names=["toy"], out_dir=tmp_path, progress=lambda line: None)
    for doc in ("README.md", "docs/X.md"):
        assert "| `toy.rate` | 2.5 |" in (tmp_path / doc).read_text(), doc
    assert (tmp_path / "docs" / "PLAIN.md").read_text() == "no figures here\n"
