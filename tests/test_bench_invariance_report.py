"""bench's report of --batch-invariant both on hand-made result rows: on/off ratios for times and token rates only,
each run against HF, and the table's lines (the runs themselves: tests/test_bench.py, slow)."""
from tinyvllm.bench.report import comparisons, format_report, invariance_ratios


def latency(system, invariant, ttft, tpot, tok_s):
    row = {"workload": "latency", "system": system, "variant": "batch 1, 4+2", "compare_key": "batch 1, 4+2",
           "ttft_ms": ttft, "tpot_ms": tpot, "output_tok_s": tok_s, "decode_weight_gb_s": 1e-6 / tpot}
    return row if invariant is None else dict(row, batch_invariant=invariant)


ROWS = [latency("tinyvllm", True, 12.0, 2.5, 400.0), latency("tinyvllm", False, 10.0, 2.0, 500.0),
        latency("hf", None, 30.0, 5.0, 200.0)]


def report(rows):
    return {"results": rows, "comparisons": comparisons(rows), "notes": [], "environment": {"device": "test"},
            "model": {"dir": "demo", "layers": 2, "hidden_size": 64, "weight_bytes": 1000}}


def test_on_off_ratios_cover_times_and_rates_of_the_same_workload_and_variant():
    ratios = {c["metric"]: (c["on"], c["off"], c["ratio"]) for c in invariance_ratios(ROWS)}
    # not the decode's GB/s: a headline, but neither a time nor a token rate
    assert ratios == {"ttft_ms": (12.0, 10.0, 1.2), "tpot_ms": (2.5, 2.0, 1.25), "output_tok_s": (400.0, 500.0, 0.8)}
    assert invariance_ratios([ROWS[0], ROWS[2]]) == []                       # one run only: nothing to divide
    other_variant = dict(ROWS[1], variant="batch 1, 8+2")
    assert invariance_ratios([ROWS[0], other_variant]) == []


def test_each_run_is_compared_with_hf():
    tpot = {c["batch_invariant"]: c["ratio"] for c in comparisons(ROWS) if c["metric"] == "tpot_ms"}
    assert tpot == {True: 0.5, False: 0.4}


def test_the_table_puts_both_runs_one_under_the_other_with_the_ratio_on_the_off_line():
    lines = format_report(report(ROWS)).splitlines()
    assert lines[1].split() == ["workload", "variant", "metric", "invariant", "tinyvllm", "on/off", "HF",
                                "tinyvllm/HF"]
    tpot = [line.split("TPOT (ms)")[1].split() for line in lines if "TPOT" in line]
    assert tpot == [["on", "2.5", "-", "5", "0.5"], ["off", "2", "1.25", "5", "0.4"]]
    rates = [line.split()[-4:] for line in lines if "output tok/s" in line]
    assert rates == [["400", "-", "200", "2"], ["500", "0.8", "200", "2.5"]]
    assert [line.split()[-3] for line in lines if "decode weights" in line] == ["-", "-"]   # no on/off for GB/s


def test_a_single_mode_run_keeps_the_plain_table_and_says_which_mode_ran():
    lines = format_report(report([ROWS[1], ROWS[2]])).splitlines()
    assert lines[1] == "batch invariance off"
    assert lines[2].split() == ["workload", "variant", "metric", "tinyvllm", "HF", "tinyvllm/HF"]
    # a report written before rows recorded the mode: no mode line, the same table
    old = [{k: v for k, v in r.items() if k != "batch_invariant"} for r in (ROWS[1], ROWS[2])]
    lines = format_report(report(old)).splitlines()
    assert lines[1].split() == ["workload", "variant", "metric", "tinyvllm", "HF", "tinyvllm/HF"]
    assert [line.split()[-3:] for line in lines if "TPOT" in line] == [["2", "5", "0.4"]]
