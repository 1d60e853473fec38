"""The public figures of ``docs/goodput.md`` and this model's output for each; ``python -m
hyperpod_lab.goodput --table`` prints the table (a test keeps the doc equal to it)."""

from __future__ import annotations

import argparse
import sys

from hyperpod_lab.goodput.advice import advise
from hyperpod_lab.goodput.closed_form import training_days
from hyperpod_lab.goodput.scenario import (
    CHECKPOINT_RESTART,
    CHECKPOINTLESS,
    DEFAULT_DETECT_S,
    DEFAULT_HEAL_S,
    DEFAULT_RESTART_S,
    cluster_mtbf_hours,
    failure_rate_from_counts,
)

LLAMA3_ASSUMPTIONS = {"checkpoint_cost_s": 60.0, "step_time_s": 10.0, "restart_s": DEFAULT_RESTART_S,
                      "detect_s": DEFAULT_DETECT_S, "heal_s": DEFAULT_HEAL_S}


def public_figures() -> list[dict]:
    """The public figures of ``docs/goodput.md`` and this model's output for each.

    Returns:
        Rows ``{"key", "figure", "source", "published", "ours", "value"}``; ``value`` holds the
        numbers the tests check against the published figure.
    """
    rows = []
    m512 = cluster_mtbf_hours(512, "0.04%")
    rows.append({"key": "cluster_mtbf_512", "figure": "512 instances at 0.04 % per instance-hour: cluster MTBF",
                 "source": "AWS HyperPod cost blog", "published": "about every 5 h (4.9 h)",
                 "ours": f"`cluster_mtbf_hours(512, '0.04%')` = {m512:.2f} h",
                 "value": {"mtbf_hours": m512}})
    l3_hours = 54 * 24.0
    l3_rate = failure_rate_from_counts(419, 16384 // 8, l3_hours)
    l3_mtbf = cluster_mtbf_hours(16384 // 8, l3_rate)
    rows.append({"key": "llama3_interruptions", "figure": "Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 H100",
                 "source": "Llama 3 paper, sec. 3.3.4, Table 5",
                 "published": "about one every 3 h; 7.76 per 24 h",
                 "ours": f"one every {l3_mtbf:.2f} h; {24.0 / l3_mtbf:.2f} per day",
                 "value": {"mtbf_hours": l3_mtbf, "per_day": 24.0 / l3_mtbf}})
    aws_rate = failure_rate_from_counts(417, 16000 // 8, l3_hours)
    rows.append({"key": "llama3_rate", "figure": "Llama 3: failure rate per instance-hour (8 GPUs an instance)",
                 "source": "AWS HyperPod cost blog (417 failures, 16,000 H100, 54 days)",
                 "published": "0.0161 %",
                 "ours": f"{aws_rate * 100:.4f} % from the blog's counts; {l3_rate * 100:.4f} % from the "
                         f"paper's 419 on 2,048 instances",
                 "value": {"rate_blog": aws_rate, "rate_paper": l3_rate}})
    opt_rate = failure_rate_from_counts(35 + 70, 992 // 8, 60 * 24.0)
    rows.append({"key": "opt175b_rate", "figure": "OPT-175B: 992 A100 (124 instances), 2 months (60 days), 35 manual + 70 automatic restarts",
                 "source": "OPT paper / AWS blog", "published": "0.0588 % per instance-hour",
                 "ours": f"{opt_rate * 100:.4f} % (a lower bound: \"70+\" automatic restarts)",
                 "value": {"rate": opt_rate}})
    ideal = training_days(6.5e6, 2048, 1.0)
    a = advise(256, l3_rate, LLAMA3_ASSUMPTIONS["checkpoint_cost_s"], LLAMA3_ASSUMPTIONS["step_time_s"],
               restart_s=LLAMA3_ASSUMPTIONS["restart_s"], detect_s=LLAMA3_ASSUMPTIONS["detect_s"],
               heal_s=LLAMA3_ASSUMPTIONS["heal_s"], work_gpu_hours=6.5e6)
    cr, cl = a["modes"][CHECKPOINT_RESTART], a["modes"][CHECKPOINTLESS]
    rows.append({"key": "llama3_days", "figure": "Llama 3: 6.5 M H100-hours on 256 p5 instances (2,048 GPUs)",
                 "source": "AWS HyperPod cost blog", "published": "about 132 days",
                 "ours": f"{ideal:.1f} days at goodput 1 (132 days implies goodput {min(1.0, ideal / 132):.2f}: "
                         f"no time lost); at Llama 3's {l3_rate * 100:.4f} % (MTBF {a['mtbf_hours']:.1f} h): "
                         f"checkpoint-restart {cr['training_days']:.1f} days (goodput {cr['goodput'] * 100:.1f} %), "
                         f"checkpointless {cl['training_days']:.1f} days (goodput {cl['goodput'] * 100:.1f} %)*",
                 "value": {"days_ideal": ideal, "implied_goodput": ideal / 132.0,
                           "days_cr": cr["training_days"], "days_cl": cl["training_days"],
                           "goodput_cr": cr["goodput"], "goodput_cl": cl["goodput"]}})
    return rows


def figures_table_markdown() -> str:
    """The public-figures table of ``docs/goodput.md`` (generated; a test keeps them equal)."""
    lines = ["| figure | source | published | our model's output |", "|---|---|---|---|"]
    for r in public_figures():
        lines.append(f"| {r['figure']} | {r['source']} | {r['published']} | {r['ours']} |")
    a = LLAMA3_ASSUMPTIONS
    lines += ["", f"\\* `advise(256, rate, checkpoint_cost_s={a['checkpoint_cost_s']:g}, step_time_s={a['step_time_s']:g}, "
              f"restart_s={a['restart_s']:g}, detect_s={a['detect_s']:g}, heal_s={a['heal_s']:g}, "
              f"work_gpu_hours=6.5e6)`: assumed costs (restore = checkpoint cost, 2 replicas), not Meta's."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m hyperpod_lab.goodput --table``: print the public-figures table (markdown)."""
    p = argparse.ArgumentParser(prog="python -m hyperpod_lab.goodput")
    p.add_argument("--table", action="store_true", help="print the public-figures table of docs/goodput.md")
    a = p.parse_args(argv)
    if not a.table:
        p.print_help()
        return 2
    sys.stdout.write(figures_table_markdown() + "\n")
    return 0
