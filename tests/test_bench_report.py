"""The bot benchmark's runs in turn merged into one result (bench/report.py `median_of`):
every figure the median of its runs, so one slow minute on the VM does not set a ratio."""

from __future__ import annotations

from bench.report import median_of, ratios


def test_each_figure_is_the_median_of_its_runs_and_the_rest_the_first_runs() -> None:
    runs = [
        {"saturation": {"conversations_per_s": 20.0, "ok": True}, "timeline": [1, 2]},
        {"saturation": {"conversations_per_s": 30.0, "ok": False}, "timeline": [3]},
        {"saturation": {"conversations_per_s": 24.0, "ok": True}, "trace": "x"},
    ]
    merged = median_of(runs)
    assert merged == {
        "saturation": {"conversations_per_s": 24.0, "ok": True},
        "timeline": [1, 2],
        "trace": "x",  # in one run only: as it is
    }
    assert median_of([{"n": 3}, {"n": 4}]) == {"n": 3.5}  # two runs: their mean
    assert repr(median_of([{"n": 100}, {"n": 100}])) == "{'n': 100}"  # a count stays one
    assert median_of([{"n": 3}, {"n": None}]) == {"n": 3}  # a missing figure: not averaged


def test_what_went_wrong_in_any_run_shows() -> None:
    """A tool run twice, a conversation lost, a failure: the worst run's count, not a median."""
    runs = [
        {"contention": {"tool_runs_ledger": 1}, "levels": {"50": {"completed": 100}}},
        {"contention": {"tool_runs_ledger": 2}, "levels": {"50": {"completed": 99}}},
        {"contention": {"tool_runs_ledger": 1}, "levels": {"50": {"completed": 100}}},
    ]
    assert median_of(runs) == {
        "contention": {"tool_runs_ledger": 2},
        "levels": {"50": {"completed": 99}},
    }
    failures = median_of([{"failures": {}}, {"failures": {"card": 2}}, {"failures": {"card": 1}}])
    assert failures == {"failures": {"card": 2}}
    logs = median_of(
        [
            {"service_log": {"levels": {"INFO": 9}, "problems": []}},
            {"service_log": {"levels": {"INFO": 7, "ERROR": 1}, "problems": ["Traceback ..."]}},
        ]
    )
    assert logs["service_log"] == {"levels": {"INFO": 9, "ERROR": 1}, "problems": ["Traceback ..."]}


def test_the_ratios_are_those_of_the_medians() -> None:
    ours = median_of([{"saturation": {"conversations_per_s": v}} for v in (10.0, 30.0, 12.0)])
    base = median_of([{"saturation": {"conversations_per_s": v}} for v in (20.0, 21.0, 50.0)])
    assert ratios(ours, base)["throughput"] == round(12.0 / 21.0, 2)
