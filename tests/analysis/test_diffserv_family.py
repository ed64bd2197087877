"""The seed-004 report's per-trial figures (analysis/families/diffserv.py) from a trial record's
GRED counters and the web generators' summaries, and the batch table built from them."""

from __future__ import annotations

import pandas as pd

from analysis.families import diffserv


def record(
    marker: str, in_min: int, counters: dict, duration: str = "500s", rate_bps: int = 6_000_000
) -> dict:
    path = {"bottleneck": {"link": "core", "rate_bps": rate_bps}}
    return {
        "parameters": {"duration": duration, "warmup": "50s"},
        "markers": {"edge": {"marker": marker}},
        "rio": {
            "R1:core": {
                "virtual_queues": [{"min_packets": in_min}, {"min_packets": 2}],
                "counters": counters,
            }
        },
        "traffic": {
            "web1": {"type": "web_poisson", "path": path},
            "web2": {"type": "web_poisson", "path": path},
        },
    }


def summary(payload: tuple[int, int], fct1: tuple[float, float]) -> dict:
    gen = [
        {
            "steady_payload_bytes": payload[i],
            "steady_window_s": 450.0,
            "fct_1pkt_flows": 10 * (i + 1),
            "fct_1pkt_mean_ms": fct1[i],
        }
        for i in range(2)
    ]
    return {
        "generators": {"web1": gen[0], "web2": gen[1]},
        "queues": {
            "core": {
                "transit_mean_ms_in_window": 80.0,
                "transit_min_ms_in_window": 40.0,  # the queue never drained in the window
                "transit_min_ms": 32.0,  # it was empty at the start
            }
        },
    }


def test_shares_from_the_counters_and_goodput_from_the_payload():
    counters = {"0": {"packets": 900, "drops": 9}, "1": {"packets": 100, "drops": 30}}
    s = diffserv.trial_summary(
        record("APM", 40, counters), summary((150_000_000, 90_000_000), (100.0, 200.0))
    )
    assert s["marker"] == "APM" and s["shortened"] is None and s["rescaled"] is None
    assert s["in_share"] == 0.9 and s["drop_total"] == 39 / 1000
    assert s["drop_in"] == 0.01 and s["drop_out"] == 0.3
    assert s["goodput_bps"] == 240_000_000 * 8 / 450
    assert abs(s["utilization"] - s["goodput_bps"] / 6e6) < 1e-12
    assert s["transit_mean_ms"] == 80.0 and s["delay_normalized"] == 80.0 / 32.0
    older = summary((150_000_000, 90_000_000), (100.0, 200.0))  # analysed before transit_min_ms
    del older["queues"]["core"]["transit_min_ms"]
    assert diffserv.trial_summary(record("APM", 40, counters), older)["delay_normalized"] == 2.0
    # Another bottleneck rate than the paper's is said (the thresholds stay in packets).
    half = diffserv.trial_summary(record("APM", 40, counters, rate_bps=3_000_000), older)
    assert half["rescaled"] == "bottleneck 3 Mbit/s"
    assert abs(half["utilization"] - 2 * s["utilization"]) < 1e-12
    # FCT means are weighted by each generator's flow count (10 and 20).
    assert s["fct_1pkt_flows"] == 30 and abs(s["fct_1pkt_mean_ms"] - 500 / 3) < 1e-9
    assert (
        diffserv.trial_summary(record("NM", 9, counters, "120s"), summary((1, 1), (1, 1)))[
            "shortened"
        ]
        == "120s, 50s discarded"
    )


def test_one_row_per_marker_and_threshold():
    rows = []
    for marker, in_min, in_share in (("NM", 9, 1.0), ("APM", 9, 0.6), ("APM", 9, 0.8)):
        rows.append(
            {"status": "complete", "marker": marker, "rio_in_min_pkt": in_min,
             "rio_out_min_pkt": 2, "in_share": in_share, "drop_total": 0.01, "drop_in": 0.0,
             "drop_out": 0.02, "goodput_bps": 5e6, "utilization": 5 / 6, "transit_mean_ms": 70.0,
             "delay_normalized": 1.5,
             **{f"fct_{p}pkt_mean_ms": 100.0 for p in diffserv.FCT_CLASSES}}
        )  # fmt: skip
    rows.append({**rows[0], "status": "failed", "in_share": 0.0})
    table = diffserv.frontier_table(pd.DataFrame(rows))
    assert list(table.marker) == ["APM", "NM"]
    apm = table[table.marker == "APM"].iloc[0]
    assert apm.runs == 2 and abs(apm["IN %"] - 70.0) < 1e-9
    assert table[table.marker == "NM"].iloc[0]["IN %"] == 100.0  # the failed run left out


def test_html_sections_write_the_table_and_one_curve_per_marker(tmp_path):
    from analysis.html_report import diffserv as html
    from analysis.html_report.page import Page

    rows = []
    for marker, in_min, goodput in (("APM", 9, 4e6), ("APM", 27, 5e6), ("NM", 9, 5.5e6)):
        rows.append(
            {"trial": f"{marker}{in_min}", "status": "complete", "analysed": True,
             "marker": marker, "rio_in_min_pkt": in_min, "rio_out_min_pkt": 2,
             "in_share": 0.5, "drop_total": 0.01, "drop_in": 0.0, "drop_out": 0.02,
             "goodput_bps": goodput, "utilization": goodput / 6e6, "transit_mean_ms": in_min,
             "delay_normalized": in_min / 9,
             **{f"fct_{p}pkt_mean_ms": float(p) for p in diffserv.FCT_CLASSES}}
        )  # fmt: skip
    rows.append({**rows[0], "trial": "x", "status": "failed", "goodput_bps": 1.0})
    page = Page("t", tmp_path)
    html.sections(page, tmp_path, pd.DataFrame(rows))
    assert {
        "diffserv_frontier.csv", "diffserv_delay_frontier.png", "diffserv_fct_frontier.png",
        "diffserv_normalized_delay.png",
    } <= set(page.files)  # fmt: skip
    csv = pd.read_csv(tmp_path / "diffserv_frontier.csv")
    assert list(zip(csv.marker, csv["goodput Mbit/s"], strict=True)) == [
        ("APM", 4.0), ("APM", 5.0), ("NM", 5.5)
    ]  # fmt: skip
    lines = dict(html.curves(diffserv.frontier_table(pd.DataFrame(rows))))
    assert list(lines["APM"]["transit ms"]) == [9, 27] and len(lines["NM"]) == 1
    # In threshold order, whatever the goodput (noise where the web load is not elastic).
    swapped = pd.DataFrame(rows).assign(goodput_bps=[5e6, 4e6, 5.5e6, 1.0])
    lines = dict(html.curves(diffserv.frontier_table(swapped)))
    assert list(lines["APM"]["IN min (pkt)"]) == [9, 27]
    assert list(lines["APM"]["goodput Mbit/s"]) == [5.0, 4.0]
    assert html.swept(lines["APM"]) == "IN min (pkt)" and html.swept(lines["NM"]) is None
    assert html.groups(pd.DataFrame(rows))[0] == "marker"


def test_a_third_level_has_its_share_and_drops_in_the_trial_and_the_table():
    """MPM over a three-level RIO: VQ 2 (AF*3, the probes) counts in the total and has its own
    share and drop share; the batch table gains HIGH % and drop HIGH %."""
    counters = {
        "0": {"packets": 100, "drops": 0},
        "1": {"packets": 800, "drops": 16},
        "2": {"packets": 100, "drops": 20},
    }
    rec = record("MPM", 333, counters)
    rec["rio"]["R1:core"]["virtual_queues"].append({"min_packets": 2})
    s = diffserv.trial_summary(rec, summary((1, 1), (1.0, 1.0)))
    assert s["in_share"] == 0.1 and s["high_share"] == 0.1 and s["high_packets"] == 100
    assert s["drop_total"] == 36 / 1000 and s["drop_out"] == 0.02 and s["drop_high"] == 0.2
    assert s["rio_high_min_pkt"] == 2
    rows = pd.DataFrame([{"status": "complete", **s}])
    table = diffserv.frontier_table(rows)
    assert table.iloc[0]["HIGH %"] == 10.0 and table.iloc[0]["drop HIGH %"] == 20.0
    (line,) = [text for name, text in diffserv.trial_rows(rows.iloc[0]) if "RIO" in name]
    assert line.startswith("IN 10.0 % of 1000 packets, HIGH 10.0 %; drops 3.60 %")
    assert line.endswith("OUT 2.00 %, HIGH 20.00 %)")
    # Two levels: no HIGH columns.
    two = diffserv.trial_summary(record("APM", 9, counters), summary((1, 1), (1.0, 1.0)))
    assert "high_share" not in two
    assert "HIGH %" not in diffserv.frontier_table(pd.DataFrame([{"status": "complete", **two}]))


def test_a_trials_keys_come_from_its_record_failed_or_not():
    counters = {"0": {"packets": 900, "drops": 9}, "1": {"packets": 100, "drops": 30}}
    rec = record("WPM", 333, counters)
    for gen in rec["traffic"].values():
        gen.update(load=0.16, seed=3)
    keys = diffserv.record_keys(rec)
    assert keys == {
        "marker": "WPM", "rio_in_min_pkt": 333, "rio_out_min_pkt": 2, "offered_load": 0.32,
        "seed": 3,
    }  # fmt: skip
    s = diffserv.trial_summary(rec, summary((1, 1), (1.0, 1.0)))
    assert {k: s[k] for k in diffserv.RECORD_KEYS} == keys
    # Those of a third level, the BPF RIO and the receivers' turnaround only where they are.
    maybe = {"rio_high_min_pkt", "high_share", "drop_high", "rio_bpf", "turnaround_excess_p99_ms"}
    assert set(diffserv.RECORD_METRICS) <= set(s) | maybe
    assert {"in_share", "drop_out", "goodput_bps", "fct_190pkt_mean_ms"} <= set(
        diffserv.RECORD_METRICS
    )
    # Generators of different seeds, or a record without loads (an older one): no value.
    list(rec["traffic"].values())[1].update(seed=4, load=None)
    assert diffserv.record_keys(rec)["seed"] is None
    assert diffserv.record_keys(rec)["offered_load"] is None


def frontier_rows(curves: dict[str, list[tuple[int, float, float, float]]], load: float = 0.64):
    """Trial rows of a batch: per marker, (threshold, goodput Mbit/s, transit ms, FCT 1 pkt)."""
    rows = []
    for marker, points in curves.items():
        for in_min, goodput, transit, fct1 in points:
            rows.append(
                {"trial": f"{marker}{in_min}", "status": "complete", "analysed": True,
                 "marker": marker, "rio_in_min_pkt": in_min, "rio_out_min_pkt": 2,
                 "offered_load": load, "in_share": {"APM": 0.97, "WPM": 0.2}.get(marker, 1.0),
                 "drop_total": 0.02, "drop_in": 0.01, "drop_out": 0.7 if marker == "APM" else 0.0,
                 "goodput_bps": goodput * 1e6, "utilization": goodput / 6,
                 "transit_mean_ms": transit, "delay_normalized": 1.5,
                 **{f"fct_{p}pkt_mean_ms": fct1 * p for p in diffserv.FCT_CLASSES}}
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_frontiers_are_compared_at_equal_goodput_over_the_range_they_share():
    from analysis.families.published import published
    from analysis.html_report.frontier import compare, curve

    (fig3,) = [o for o in published("diffserv").orderings if o.figure.startswith("Fig. 3")]
    assert fig3.against == "goodput_bps" and fig3.more == ["NM", "WPM"] and fig3.than == ["APM"]
    rows = frontier_rows(
        {
            "NM": [(9, 4.0, 100, 1), (40, 5.0, 200, 1), (240, 5.6, 400, 1)],
            "WPM": [(9, 4.2, 120, 1), (240, 5.5, 380, 1)],
            "APM": [(9, 4.5, 60, 1), (40, 5.2, 90, 1), (240, 5.9, 150, 1)],
        }
    )

    def curves(table, o=fig3):
        return {
            m: curve(r, ["rio_in_min_pkt", "rio_out_min_pkt"], o.against, o.metric)
            for m, r in table.groupby("marker")
            if m in o.more + o.than
        }

    found = compare(curves(rows), fig3)
    # The goodputs all three cover: 4.5 to 5.5 Mbit/s; points there and at its ends.
    assert found["span"] == (4.5e6, 5.5e6) and found["held"] == found["points"] == 4
    # NM at 4.5 Mbit/s lies halfway between its points (150 ms), at 5.5 at 5/6 (367 ms).
    assert found["means"]["NM"] == (150 + 200 + (200 + 200 * 2 / 6) + (200 + 200 * 5 / 6)) / 4
    assert found["means"]["APM"] < min(found["means"]["WPM"], found["means"]["NM"])
    # APM's delay above NM's at high goodput only: the statement holds at some points.
    crossing = rows.copy()
    crossing.loc[
        (crossing.marker == "APM") & (crossing.rio_in_min_pkt == 240), "transit_mean_ms"
    ] = 900
    partly = compare(curves(crossing), fig3)
    assert 0 < partly["held"] < partly["points"]
    # Curves that share no goodput are not compared.
    apart = rows.assign(
        goodput_bps=rows.goodput_bps.where(rows.marker != "APM", rows.goodput_bps + 5e6)
    )
    assert compare(curves(apart), fig3)["span"] is None
    # A region takes the lower or upper half of the shared range.
    low = next(o for o in published("diffserv").orderings if o.region == "low")
    assert low.more == ["APM"] and compare(curves(rows, low), low)["span"][1] == 5.0e6


def test_the_report_puts_table_two_and_the_papers_statements_beside_ours(tmp_path):
    from analysis.html_report import diffserv as html
    from analysis.html_report.page import Page

    rows = frontier_rows(
        {
            "NM": [(9, 4.0, 100, 100), (240, 5.6, 400, 300)],
            "WPM": [(9, 4.2, 120, 50), (240, 5.5, 380, 400)],
            "APM": [(9, 4.5, 60, 90), (240, 5.9, 150, 200)],
        }
    )
    page = Page("t", tmp_path)
    html.sections(page, tmp_path, rows)
    assert {
        "table2_vs_paper.csv", "frontier_orderings_vs_paper.csv", "orderings_vs_paper.csv"
    } <= set(page.files)  # fmt: skip
    table2 = pd.read_csv(tmp_path / "table2_vs_paper.csv").set_index("ours")
    assert table2.loc["APM", "paper IN %"] == "97-98" and table2.loc["APM", "IN %"] == "97.0–97.0"
    statements = pd.read_csv(tmp_path / "frontier_orderings_vs_paper.csv")
    fig3 = statements[statements.figure.str.startswith("Fig. 3")].iloc[0]
    # Shared: 4.5 to 5.5 Mbit/s, no point of ours inside it but its ends.
    assert fig3["ours as the paper"] and fig3["points in the paper's order"] == "2 of 2"
    # 1-packet flows at high utilization: APM (200 ms at 5.5) is not below WPM (400): held.
    high = statements[statements.figure.str.contains("1-packet flows vs goodput, high")].iloc[0]
    assert bool(high["ours as the paper"])
    # MPM did not run: Fig. 6's statement has no row.
    assert not statements.figure.str.startswith("Fig. 6").any()
    settings = pd.read_csv(tmp_path / "orderings_vs_paper.csv")
    assert set(settings.figure) == {
        "Table II (section V): IN packets' share", "Table II (section V): OUT packets dropped"
    }  # fmt: skip
    assert settings["ours as the paper"].all()
