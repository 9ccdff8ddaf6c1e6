"""The instructor page's figure and table (book/labs/instructor.md): each lab's measured seconds (labs/times.json,
`pylib.labs.course.read_times`) and hardware profile (`pylib.labs.course.lab_profiles`), handed in as data.

    fig = plot_times(times)                         # bars: seconds per lab, solved and as the learner gets it
    Markdown(course_table(times, profiles))         # tbl-labs-times
"""

from __future__ import annotations

from pylib.tables import markdown_table

from ..i18n import tr
from . import style


def course_table(times: dict, profiles: dict[str, dict]) -> str:
    """tbl-labs-times: one row per lab: its ranks (processes on CPU, GPUs under NCCL), seconds solved and as the
    learner gets it, the checks that need GPUs."""
    if set(times["labs"]) != set(profiles):
        raise ValueError(f"labs/times.json and the labs differ: {sorted(set(times['labs']) ^ set(profiles))}")
    rows = []
    for name in sorted(profiles):
        t, p = times["labs"][name], profiles[name]
        gpu = ", ".join(f"`{n}`" for n in p["gpu_checks"]) or tr("none")
        rows.append([f"`{name}`", p["ranks"], f"{t['solution_seconds']:.0f}", f"{t['learner_seconds']:.0f}", gpu])
    header = [
        tr("lab"),
        tr("ranks (GPUs under NCCL)"),
        tr("solved run (s)"),
        tr("learner run (s)"),
        tr("checks that need GPUs"),
    ]
    caption = tr(
        "Each lab on {cpus} CPU cores ({torch}, gloo), measured {date}, kernel start included",
        cpus=times["machine"]["cpus"],
        torch=f"torch {times['machine']['torch']}",
        date=times["measured"],
    )
    return markdown_table(header, rows, caption, "tbl-labs-times")


def plot_times(times: dict):
    """Horizontal bars: each lab's seconds, solved and learner runs."""
    names = sorted(times["labs"])
    solved = [times["labs"][n]["solution_seconds"] for n in names]
    learner = [times["labs"][n]["learner_seconds"] for n in names]
    with style.use():  # every text in the book's fonts (the CJK one in the Chinese edition)
        fig, ax = style.subplots(figsize=(6.4, 0.32 * len(names) + 1.2), grid="x")
        ys = range(len(names))
        bar = dict(height=0.4)
        ax.barh([y - 0.2 for y in ys], solved, color=style.rank_colour(0), label=tr("solved"), **bar)
        ax.barh([y + 0.2 for y in ys], learner, color=style.rank_colour(1), label=tr("as the learner gets it"), **bar)
        ax.set_yticks(list(ys), names)
        ax.invert_yaxis()
        ax.set_xlabel(tr("seconds on {cpus} CPU cores", cpus=times["machine"]["cpus"]))
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
        fig.tight_layout()
    return fig
