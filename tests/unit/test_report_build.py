"""`build_report` / `write_report` on a study written by the real trial runner (see test_report_fixtures)."""

from __future__ import annotations

import json
import math
import re

import optuna
import pytest
import yaml

from tests.unit.test_report_fixtures import MODEL, fixture_study
from tuner.errors import UserError
from tuner.knobs import Knobs
from tuner.report import Report, build_report, write_report
from tuner.report.build import config_yaml
from tuner.storage.select import closest_run, sane_goodput
from tuner.storage.reader import load_study_data
from tuner.storage.records import LoadRunSummary


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return fixture_study(tmp_path_factory)


@pytest.fixture(scope="module")
def rep(run) -> Report:
    return build_report(run)


def test_baseline_and_tuned_are_the_stored_trials(run, rep):
    data = load_study_data(run)
    recs = {t.number: t.record for t in data.trials}
    assert rep.baseline.trial == 0 and rep.baseline.knobs == {}
    assert rep.baseline.capacity_rps == recs[0].capacity_rps
    tuned = data.outcome["tuned_trial"]
    assert rep.tuned.trial == tuned
    assert rep.tuned.capacity_rps == recs[tuned].capacity_rps
    assert rep.tuned.capacity_rps > rep.baseline.capacity_rps
    assert [r.rate for r in rep.tuned.knee] == sorted({r.rate for r in recs[tuned].load_runs})
    assert sum(rep.counts.values()) == len(data.trials) == len(rep.trials)


def test_simulated_title_and_plain_caveats(rep):
    assert rep.simulated and rep.title.startswith("SIMULATED")
    text = "\n".join(rep.caveats)
    assert "SIMULATED" in text and "not from a real GPU" in text
    assert "quality was NOT measured" in text          # the tuned config quantizes (fp8 KV at least)
    assert "Noise floor" in text and "5%" in text
    assert "raced out" in text and "1 failed" in text


def test_headline_compares_at_the_baselines_capacity(rep):
    h = rep.headline
    assert h.compare_rate_rps == rep.baseline.capacity_rps
    b = closest_run(rep.baseline.knee, h.compare_rate_rps)
    t = closest_run(rep.tuned.knee, h.compare_rate_rps)
    same = {r.metric: r for r in h.rows if r.at == "same_rate"}
    own = {r.metric: r for r in h.rows if r.at == "capacity"}
    assert own["capacity within the SLO"].tuned == rep.tuned.capacity_rps
    assert same["p99 TTFT"].baseline == b.p99_ms["ttft"]
    if abs(t.rate / h.compare_rate_rps - 1) <= 0.15:
        assert same["p99 TTFT"].tuned == t.p99_ms["ttft"] and h.tuned_closest_rate is None
    else:  # never measured near the baseline's capacity: no pretend comparison
        assert same["p99 TTFT"].tuned is None and h.tuned_closest_rate == t.rate
    at_cap = closest_run(rep.tuned.knee, rep.tuned.capacity_rps)
    assert at_cap.passed and own["p99 TPOT"].tuned == at_cap.p99_ms["tpot"] <= 50
    assert own["goodput"].baseline <= 1.2 * rep.baseline.capacity_rps     # never above the offered rate
    assert h.capacity_gain_pct == pytest.approx(100 * (rep.tuned.capacity_rps / rep.baseline.capacity_rps - 1))


def _run(rate, ok=True, ttft=100.0):
    return LoadRunSummary(rate=rate, n=800, attainment=0.995 if ok else 0.9, ci_low=0.98, ci_high=0.999,
                          passed=ok, goodput=rate, p99_ms={"ttft": ttft, "tpot": 30.0, "e2el": 9000.0})


def test_same_rate_rows_only_from_runs_near_the_comparison_rate():
    from tuner.report.build import headline
    from tuner.report.model import ConfigSummary

    base = ConfigSummary(label="b", capacity_rps=6.0, knee=[_run(4.0), _run(6.0, ttft=280), _run(7, False)])
    near = ConfigSummary(label="t", capacity_rps=12.0, knee=[_run(6.5, ttft=90), _run(12.0), _run(13, False)])
    h = headline(base, near)
    same = {r.metric: r for r in h.rows if r.at == "same_rate"}
    assert same["p99 TTFT"].baseline == 280 and same["p99 TTFT"].tuned == 90 and h.tuned_run_rate == 6.5
    far = near.model_copy(update={"knee": [_run(12.0, ttft=250), _run(13, False)]})
    h = headline(base, far)
    same = {r.metric: r for r in h.rows if r.at == "same_rate"}
    own = {r.metric: r for r in h.rows if r.at == "capacity"}
    assert same["p99 TTFT"].tuned is None and h.tuned_closest_rate == 12.0
    assert own["p99 TTFT"].tuned == 250 and own["p99 TTFT"].baseline == 280


def test_gain_is_attributed_knob_by_knob_and_adds_up(rep):
    steps = rep.attribution
    assert steps, "an accepted trial must be attributed"
    assert steps[0].before_rps == rep.baseline.capacity_rps
    assert steps[-1].after_rps == rep.tuned.capacity_rps
    for a, b in zip(steps, steps[1:]):
        assert b.before_rps == a.after_rps
    assert math.prod(s.after_rps / s.before_rps for s in steps) == pytest.approx(
        rep.tuned.capacity_rps / rep.baseline.capacity_rps)
    first = steps[0]
    # which knob the search turns first depends on the measured landscape (FP8 KV or FP8 weights here);
    # whichever it is, the change names vLLM's resolved default
    (knob,) = first.knobs_changed
    assert knob in ("kv_cache_dtype", "quantization")
    expected = {"kv_cache_dtype": "default (auto) -> fp8", "quantization": "default ("}[knob]
    assert first.change.startswith(f"{knob}: {expected}") and " -> " in first.change, first.change


def test_tuned_config_as_command_line_and_vllm_config_file(rep):
    flags = Knobs(**rep.tuned.knobs).flags()
    assert rep.serve_command == " ".join(["vllm", "serve", MODEL, *flags])
    body = yaml.safe_load(rep.config_yaml)
    assert body == {k.replace("_", "-"): v for k, v in rep.tuned.knobs.items()}
    assert "--config tuned-config.yaml" in rep.config_yaml


def test_config_yaml_spells_off_and_empty_so_vllm_reads_them():
    assert yaml.safe_load(config_yaml("m", {"enable_prefix_caching": False, "max_num_seqs": 512})) == {
        "no-enable-prefix-caching": True, "max-num-seqs": 512}
    assert yaml.safe_load(config_yaml("m", {})) == {}


def test_plan_is_part_of_the_report_when_the_slo_has_a_peak_rate(rep):
    assert rep.plan is not None and rep.plan.feasible
    assert rep.plan.instances == math.ceil(50 / (0.7 * rep.tuned.capacity_rps))
    assert "instances: ceil(50 / (0.7 x" in rep.plan_text


def test_write_report_files_are_consistent_and_self_contained(run, tmp_path):
    rep = write_report(run, tmp_path)
    for name in ("report.md", "report.html", "report.json", "tuned-config.yaml"):
        assert (tmp_path / name).stat().st_size > 0, name
    # the report reads storage and writes no gate (`tune report` and the study write it first), and it
    # says so rather than pointing at a gate.yaml that is not there
    assert not (tmp_path / "gate.yaml").exists() and rep.gate_written is False
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["baseline"]["capacity_rps"] == rep.baseline.capacity_rps
    assert data["tuned"]["capacity_rps"] == rep.tuned.capacity_rps
    Report.model_validate(data)
    md = (tmp_path / "report.md").read_text()
    figs = re.findall(r"!\[[^\]]*\]\((plots/[^)]+)\)", md)
    assert len(figs) == 6  # the five charts and the knob-by-knob shares beside their table
    for f in figs:
        svg = (tmp_path / f).read_text()
        assert svg.lstrip().startswith(("<?xml", "<svg")) and "</svg>" in svg
        # only the XML namespace identifiers may name a web address; every reference is internal
        assert set(re.findall(r"https?://[^\s\"']+", svg)) <= {"http://www.w3.org/2000/svg",
                                                            "http://www.w3.org/1999/xlink"}, f
        assert not re.findall(r"""(?:href|src)\s*=\s*["'](?!#)""", svg), f
    html = (tmp_path / "report.html").read_text()
    assert html.count('<img ') == 6 and html.count("data:image/svg+xml;base64,") == 6
    assert not re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, flags=re.I)
    assert "<script" not in html.lower() and "@import" not in html and "url(" not in html
    assert (tmp_path / "tuned-config.yaml").read_text() == rep.config_yaml


def test_rebuilt_report_is_identical_apart_from_the_timestamp(run):
    a = build_report(run).model_dump(exclude={"generated_unix"})
    b = build_report(run).model_dump(exclude={"generated_unix"})
    assert a == b


def test_without_the_outcome_the_last_accepted_trial_is_tuned(tmp_path_factory, tmp_path):
    run = fixture_study(tmp_path_factory, tmp_path / "copy")
    study = optuna.load_study(study_name="slo-tuner", storage=f"sqlite:///{run / 'study.db'}")
    want = study.user_attrs["outcome"]["tuned_trial"]
    study.set_user_attr("outcome", None)
    assert build_report(run).tuned.trial == want


def test_a_study_where_nothing_beat_the_defaults(tmp_path_factory, tmp_path):
    src = load_study_data(fixture_study(tmp_path_factory))
    run = tmp_path / "only-baseline"
    run.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{run / 'study.db'}", study_name="slo-tuner",
                                direction="maximize")
    study.set_user_attr("info", src.info.model_dump(mode="json"))
    base = src.trials[0].record
    study.add_trial(optuna.trial.create_trial(value=base.capacity_rps,
                                              user_attrs={"record": base.model_dump(mode="json")}))
    rep = build_report(run)
    assert rep.tuned.trial == rep.baseline.trial == 0
    assert rep.attribution == []
    assert any("No configuration beat vLLM's defaults" in c for c in rep.caveats)
    assert rep.serve_command == f"vllm serve {MODEL}"


def test_not_a_run_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        build_report(tmp_path / "missing")
    with pytest.raises(UserError, match="no study.db"):
        build_report(tmp_path)
    (tmp_path / "study_name.txt").write_text("other\n")
    optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="slo-tuner")
    with pytest.raises(UserError, match="no study named 'other'"):
        build_report(tmp_path)
    (tmp_path / "study_name.txt").unlink()
    with pytest.raises(UserError, match="no `info` attribute"):
        build_report(tmp_path)


def test_storage_txt_names_the_storage(tmp_path_factory, tmp_path):
    src = fixture_study(tmp_path_factory)
    run = tmp_path / "run"
    run.mkdir()
    (run / "storage.txt").write_text(f"sqlite:///{src / 'study.db'}\n")
    rep = build_report(run)
    assert rep.tuned.capacity_rps == build_report(src).tuned.capacity_rps
    assert rep.storage.startswith("sqlite:///")


def test_pooled_goodput_is_capped_at_the_offered_rate():
    p = LoadRunSummary(rate=6.0, n=1700, attainment=0.99, ci_low=0.98, ci_high=0.995, passed=True,
                       goodput=11.9, repeats=2)
    assert sane_goodput(p).goodput == pytest.approx(0.99 * 6.0)
    single = p.model_copy(update={"repeats": 1, "goodput": 5.9})
    assert sane_goodput(single).goodput == 5.9


def test_a_study_where_nothing_met_the_slo(tmp_path_factory, tmp_path):
    src = load_study_data(fixture_study(tmp_path_factory))
    run = tmp_path / "hopeless"
    run.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{run / 'study.db'}", study_name="slo-tuner",
                                direction="maximize")
    study.set_user_attr("info", src.info.model_dump(mode="json"))
    base = src.trials[0].record
    failing = [r.model_copy(update={"passed": False}) for r in base.load_runs]
    base = base.model_copy(update={"capacity_rps": None, "load_runs": failing, "accepted": False,
                                   "latency_at_capacity": None})
    study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs={"record": base.model_dump(mode="json")}))
    rep = write_report(run)
    assert rep.tuned.capacity_rps is None and rep.plan is None
    assert rep.headline.compare_rate_rps == min(r.rate for r in failing)
    assert any("No configuration met the SLO at any offered rate" in c for c in rep.caveats)
    assert not (run / "gate.yaml").exists()        # nothing to gate
    # no result, said plainly: nothing presented as the best or tuned configuration, no gate pointed to
    assert rep.status == "no_pass" and rep.tuned.trial is None and rep.gate_written is False
    md = (run / "report.md").read_text()
    assert "NO RESULT" in md.splitlines()[0] and "## Headline" not in md and "tune gate" not in md


def test_the_saturation_probe_is_not_a_point_of_the_knee(run, rep):
    stored = load_study_data(run).trials[0].record.load_runs
    probes = [r for r in stored if r.rate >= 1e5]
    assert all(r.rate < 1e5 for r in rep.baseline.knee + rep.tuned.knee)
    if probes:  # the search sent the whole run at once: its throughput is the engine's ceiling
        assert rep.baseline.saturation_rps == probes[0].throughput_rps
        assert len(rep.baseline.knee) == len({r.rate for r in stored}) - 1


def test_a_knob_a_step_set_back_to_its_default_is_in_a_recommendation_that_leaves_it_there(rep):
    """A later step may return a knob to vLLM's default (512 sequences, then the default again): where the
    recommendation leaves it at the default too, the knob table says the change is in it, and a step's
    value the recommendation does not carry is not."""
    from tuner.report.render import to_markdown
    from tuner.storage.select import KnobRow, KnobStep

    tuned = rep.tuned.model_copy(update={"trial": 7, "knobs": {"kv_cache_dtype": "fp8"}})
    trials = [t for t in rep.trials if t.number not in (6, 7)] + [
        t.model_copy(update={"number": n, "knobs": k}) for t, (n, k) in zip(
            rep.trials[:2], ((6, {"max_num_seqs": 512, "kv_cache_dtype": "fp8"}), (7, {"kv_cache_dtype": "fp8"})))]
    steps = [KnobStep(trial=6, knobs_changed=["max_num_seqs"], change="max_num_seqs: default (256) -> 512",
                      before_rps=7.0, after_rps=7.5, gain_rps=0.5, gain_pct=7.1,
                      rows=[KnobRow(knob="max_num_seqs", change="max_num_seqs: default (256) -> 512", share_pct=7.1)]),
             KnobStep(trial=7, knobs_changed=["max_num_seqs"], change="max_num_seqs: 512 -> default (256)",
                      before_rps=7.5, after_rps=7.6, gain_rps=0.1, gain_pct=1.3,
                      rows=[KnobRow(knob="max_num_seqs", change="max_num_seqs: 512 -> default (256)", share_pct=1.3)])]
    md = to_markdown(rep.model_copy(update={"tuned": tuned, "trials": trials, "attribution": steps}), set())
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if "| max_num_seqs |" in line}
    assert "| no |" in rows["6"] and "| yes |" in rows["7"], rows


@pytest.mark.parametrize("paired", [False, True])
def test_a_knob_whose_share_was_only_predicted_is_not_shown_as_measured_to_matter(rep, paired):
    """A multi-knob step's shares are the twin's predictions. Without the paired check (real-time engines'
    default) nothing measured each knob: the knob table says a kept knob rides along unproven and the text
    does not claim a paired measurement decided it; with the paired check it does."""
    from tuner.report.render import to_markdown
    from tuner.storage.select import KnobRow, KnobStep

    knobs = {"max_num_seqs": 16, "enable_prefix_caching": False}
    tuned = rep.tuned.model_copy(update={"trial": 1, "knobs": knobs})
    trials = [t for t in rep.trials if t.number != 1] + [rep.trials[0].model_copy(update={"number": 1, "knobs": knobs})]
    rows = [KnobRow(knob="max_num_seqs", change="max_num_seqs: default (128) -> 16", share_pct=12.0,
                    source="predicted", predicted_share_pct=12.0),
            KnobRow(knob="enable_prefix_caching", change="enable_prefix_caching: default (on) -> off",
                    share_pct=0.0, source="predicted", predicted_share_pct=0.0, within_noise=True)]
    steps = [KnobStep(trial=1, knobs_changed=list(knobs), change="two knobs", before_rps=4.0, after_rps=4.5,
                      gain_rps=0.5, gain_pct=12.5, rows=rows)]
    recommendation = rep.recommendation.model_copy(update={"paired": paired, "kind": "tuned", "trial": 1,
                                                           "knobs": knobs})
    md = to_markdown(rep.model_copy(update={"tuned": tuned, "trials": trials, "attribution": steps,
                                            "recommendation": recommendation}), set())
    table = [line for line in md.splitlines() if line.startswith("| 1 | ") and "(predicted)" in line]
    assert len(table) == 2
    claim = "which knobs the recommendation keeps is measured, paired"
    if paired:
        assert all("| yes |" in line for line in table) and claim in md
    else:
        assert all("| yes (not measured alone) |" in line for line in table), table
        assert claim not in md and "rides with it unproven" in md


def test_shares_all_n_a_are_a_sentence_not_an_empty_chart(rep):
    """A step of several knobs with no prediction and no measurement of each: every share is n/a, so no
    share chart is drawn (it was an empty frame) and the report says why in its place."""
    from tuner.report.plots import knob_shares
    from tuner.report.render import to_html, to_markdown
    from tuner.storage.select import KnobRow, KnobStep

    rows = [KnobRow(knob=k, change=f"{k}: default -> x", share_pct=None, source="unknown")
            for k in ("max_num_seqs", "enable_prefix_caching")]
    steps = [KnobStep(trial=1, knobs_changed=[r.knob for r in rows], change="two knobs", before_rps=4.0,
                      after_rps=4.5, gain_rps=0.5, gain_pct=12.5, rows=rows)]
    unknown = rep.model_copy(update={"attribution": steps})
    assert knob_shares(unknown) is None
    why = "No chart of the shares: every knob's share above is n/a"
    assert why in to_markdown(unknown, set()) and why in to_html(unknown, {})
    known = rows[:1] + [rows[1].model_copy(update={"share_pct": 3.0, "source": "predicted"})]
    partly = rep.model_copy(update={"attribution": [steps[0].model_copy(update={"rows": known})]})
    assert knob_shares(partly) is not None and why not in to_markdown(partly, {"shares"})


def test_a_trial_launched_once_is_never_said_to_have_been_launched_twice(rep):
    """"launched twice" and "its second launch" are said only of a configuration the study launched more
    than once; a lone launch off the final chain says what it was."""
    from tuner.report.render import to_markdown

    base, other = rep.trials[0], rep.trials[1]
    lone = [base.model_copy(update={"incumbent": False, "capacity_rps": None, "role": "baseline"}),
            other.model_copy(update={"number": 1, "incumbent": False, "accepted": True, "role": "candidate",
                                     "knobs": {"max_num_seqs": 7}, "raced_out": False, "launch_failure_kind": None,
                                     "quality": None})]
    md = to_markdown(rep.model_copy(update={"trials": lone, "attribution": []}), set())
    assert "launched twice" not in md and "second launch" not in md
    assert "met the SLO at no rate" in md and "not on the search's final chain" in md
    pair = [lone[0].model_copy(update={"capacity_rps": 5.0}), lone[0].model_copy(update={"number": 2, "capacity_rps": 5.2})]
    assert "launched twice" in to_markdown(rep.model_copy(update={"trials": pair, "attribution": []}), set())


def test_every_chart_is_readable_at_the_reports_width(rep, monkeypatch):
    """Every chart the report draws, checked as drawn: no text over another (an axis label over the next
    panel, tick labels over an axis title), no legend over a curve."""
    from tuner.report import plots

    monkeypatch.setattr(plots, "PROBLEMS", [])
    drawn = [name for name, draw in plots.PLOTS.items() if draw(rep)]
    assert {"knee", "capacity", "knobs", "latency_cdf", "timeseries"} <= set(drawn), drawn
    assert plots.PROBLEMS == []


def test_a_long_studys_charts_fit_the_page(rep, monkeypatch):
    """Forty trials: the charts with a column per trial stay within the report's width (12.5 in: a wider
    one is shrunk to fit, and its labels under what can be read) and still draw no text over another."""
    from tuner.report import plots

    many = [rep.trials[i % len(rep.trials)].model_copy(update={"number": i}) for i in range(40)]
    long = rep.model_copy(update={"trials": many})
    monkeypatch.setattr(plots, "PROBLEMS", [])
    for draw in (plots.capacity_per_trial, plots.knob_trajectory):
        svg = draw(long)
        assert svg is not None
        width = float(re.search(r'<svg[^>]* width="([0-9.]+)pt"', svg).group(1))
        assert width <= 12.5 * 72, (draw.__name__, width)
    assert plots.PROBLEMS == []


def test_the_layout_check_finds_overlaps_and_covered_curves():
    import matplotlib.pyplot as plt

    from tuner.report.plots import layout_problems

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a curve")
    ax.text(0.5, 0.5, "one label")
    ax.text(0.5, 0.5, "another label")
    ax.legend(loc="center")
    found = layout_problems(fig)
    plt.close(fig)
    assert any("overlaps" in p for p in found) and any("covers 'a curve'" in p for p in found), found
